// Package routes owns the route table of applistener: sandbox instances,
// their services and hostnames, installation versions, freshness deadlines,
// revocation leases and the immutable snapshots the data plane reads without
// locks. It also validates the configuration documents that the control plane
// delivers.
//
// Hostnames have the form {workspace}--{sandbox}--{service}.{domain} for a
// named service and {workspace}--{sandbox}.{domain} for the unnamed (default)
// service when that first label fits in 63 characters; otherwise the label is
// a hashed one, "h-" and the unpadded lower-case base32 SHA-256 of
// "{workspace}/{sandbox}/{service}" (see [Label]). [NormalizeHost] brings a TLS server name or an HTTP Host into the
// canonical form that routes are matched against (lower case, no port, no
// trailing dot) without allocating in the common case; [Hostname] builds a
// service's hostname and [ParseHostname] splits a readable one into its parts
// (a hashed one only parses as hashed: the digest cannot be reversed).
//
// [ParseDocument] decodes and validates a configuration document: the whole
// document is refused when it cannot be parsed, and an instance entry that
// fails validation is reported in [Document.Rejected] while the others are
// accepted.
//
// The package does no network I/O.
package routes
