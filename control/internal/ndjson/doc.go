// Package ndjson is the control plane's one watch-stream machine: the NDJSON
// streams on which the gateway pushes configuration documents to a
// supervisor (GET /v1/supervisors/{id}/config?watch=1) and discovery
// snapshots to a reader (GET /v1/workspaces/{ws}/service-routes?watch=1),
// each line a complete JSON value or the keepalive line.
//
// The server side (server.go) is a Stream, whose Send sets the write
// deadline, writes, flushes and clears the deadline by one rule, and a
// Mailbox, the one-slot box through which a watch is handed the latest
// value to write and told to end, under its own lock.
//
// The client side (client.go) is one line reader that tells keepalives by
// one rule and calls a stream dead after a silence, one Backoff whose every
// delay can be bounded by what the caller still holds, and one Sleep that
// ends with its context.
package ndjson
