"""The mirror relay: production's request logs turned into mirror records (docs/mirror.md).

For a production runtime without the bundled tap (vLLM), ddops installs this package on the
production host and runs it as its own unit (`python3 -m relay`). It follows the runtime's
journal, pairs each request's log lines into the record the shadow's `POST /mirror/records`
takes, and sends the records with the tap's rules: a bounded queue, drop and count, a 2 s
bound per send, a 1 s backoff after a failed one. It serves its counts at `GET /mirror`, in
the tap's fields, so `ddops shadow compare --mirrored` reads either the same way.

Standard library only, and nothing of ddops or serving: it runs under the host's python3.
"""
