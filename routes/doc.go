// Package routes owns the route table of applistener: sandbox instances,
// their services and hostnames, installation versions, freshness deadlines,
// revocation leases and the immutable snapshots the data plane reads without
// locks. It also validates the configuration documents that the control plane
// delivers.
//
// Hostnames have the form {workspace}--{sandbox}--{service}.{domain} for a
// named service and {workspace}--{sandbox}.{domain} for the unnamed (default)
// service. [NormalizeHost] brings a TLS server name or an HTTP Host into the
// canonical form that routes are matched against (lower case, no port, no
// trailing dot) without allocating in the common case; [ParseHostname] and
// [Hostname] convert between hostnames and their parts.
//
// [ParseDocument] decodes and validates a configuration document: the whole
// document is refused when it cannot be parsed, and an instance entry that
// fails validation is reported in [Document.Rejected] while the others are
// accepted.
//
// The package does no network I/O.
package routes
