"""A small shop: four Python services that talk HTTP, instrumented with
OpenTelemetry (standard WSGI, requests and psycopg2 instrumentations) and
deepspan_otel. `python3 -m shop.service NAME` runs one of them.

- front:     the public API (/product, /checkout, /image); calls the others.
- inventory: stock and orders in PostgreSQL (psycopg2, Unix socket).
- pricing:   CPU-bound price computation; one request at a time, like a
             synchronous worker.
- media:     product images read from local files, without keeping them in
             the page cache (they are large and rarely read twice).
"""
