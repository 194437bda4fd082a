"""``python -m benchmarks``: see :mod:`benchmarks`."""

from __future__ import annotations

import argparse
import json
import shlex
import sys

from benchmarks import all_workloads, default_bench_dir, run
from benchmarks.harness import Config
from benchmarks.report import matplotlib_missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="walkv vs its peers (LevelDB, RocksDB, LMDB, SQLite, a plain fdatasync "
                    "loop), alternating in one run; medians and walkv/peer ratios vs the "
                    "issues' targets.")
    parser.add_argument("--quick", action="store_true", help="small sizes, seconds in all")
    parser.add_argument("--only", help="comma-separated workload names or prefixes "
                                       "(log, kv, snap, spark, log.append.durable.8t, ...)")
    parser.add_argument("--repeats", type=int, help="alternating repeats (default 3; 2 quick)")
    parser.add_argument("--duration", type=float,
                        help="seconds per time-boxed run (default 5; 0.5 quick)")
    parser.add_argument("--json", metavar="FILE", help="write the full report as JSON")
    parser.add_argument("--plot", metavar="FILE.png", help="draw the ratios (matplotlib)")
    parser.add_argument("--dir", metavar="DIR", help="where the data goes "
                                                     "(default $WALKV_BENCH_DIR or the temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the data directories")
    parser.add_argument("--plain", action="store_true", help="plain-text table even if rich is there")
    parser.add_argument("--walkv-alone", action="store_true", help=argparse.SUPPRESS)  # --pure's child
    parser.add_argument("--pure", action="store_true",
                        help="one more contender per workload: walkv interpreted (WALKV_PURE=1) in a child "
                             "process per repeat, for the compiled/pure ratio (benchmarks.pure)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument("--list", action="store_true", help="list the workloads and exit")
    parser.add_argument("--scale", metavar="SIZES",
                        help="instead: the scale benchmark (issue 15) at these store sizes, e.g. "
                             "1M,10M,50M (minutes to hours; --only picks its metrics, --plot draws "
                             "the curves; see benchmarks.scale)")
    args = parser.parse_args(argv)
    if args.list:
        for w in all_workloads(Config(quick=args.quick)):
            print(f"{w.name:28} issue {w.issue}{'  (slow: only with --only)' if w.slow else ''}  {w.title}")
        return 0
    if args.repeats is not None and args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.walkv_alone:  # the child --pure runs (benchmarks.pure): one workload's walkv side, as JSON
        from benchmarks.harness import select
        from benchmarks.pure import walkv_alone

        cfg = Config(quick=args.quick, repeats=args.repeats or (2 if args.quick else 3),
                     base_dir=args.dir or default_bench_dir(), duration=args.duration, verbose=False)
        (workload,) = [w for w in select(all_workloads(cfg), [args.only]) if w.name == args.only]
        json.dump(walkv_alone(workload, cfg), sys.stdout)
        return 0
    if args.plot and (error := matplotlib_missing()):  # before the run, not after an hour of it
        print(error, file=sys.stderr)
        return 2
    command = "python -m benchmarks " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    if args.scale:
        from benchmarks.scale import run_scale
        from benchmarks.scale_metrics import parse_sizes

        try:
            sizes = parse_sizes(args.scale)
            only = [s.strip() for s in args.only.split(",") if s.strip()] if args.only else None
            run_scale(sizes, repeats=args.repeats, duration=args.duration, only=only, json_path=args.json,
                      plot_path=args.plot, bench_dir=args.dir, keep=args.keep, verbose=not args.quiet,
                      command=command)
        except ValueError as exc:
            parser.error(str(exc))
        return 0
    try:
        report = run(quick=args.quick, only=args.only, repeats=args.repeats, json_path=None,
                     plot_path=args.plot, bench_dir=args.dir, keep=args.keep,
                     duration=args.duration, verbose=not args.quiet, plain=args.plain, pure=args.pure)
    except ValueError as exc:
        parser.error(str(exc))
    if args.json:
        from benchmarks.report import write_json

        report["command"] = command
        write_json(report, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
