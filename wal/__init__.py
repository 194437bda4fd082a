"""walkv's write-ahead log: LevelDB-format records in segmented files, group commit."""
