"""walkv's HTTP clients and the wire format they share with the server
(docs/http-api.md): :mod:`~kvstore.client.remote` (``kvstore.connect``),
:mod:`~kvstore.client.aremote` (``kvstore.connect_async``),
:mod:`~kvstore.client.calls` (each request built once, for both),
:mod:`~kvstore.client.batches` (a batch's and transaction's operations as JSON),
:mod:`~kvstore.client.http` (the httpx transport), :mod:`~kvstore.client.events`
(reading and resuming change streams) and :mod:`~kvstore.client.wire`
(base64, the error table both ways)."""
