// Package tlsconf provides the certificates and TLS configuration of the
// applistener data plane.
//
// It covers three concerns:
//
//   - [Store] holds the serving certificate read from a Kubernetes TLS Secret
//     directory (DIR/tls.crt and DIR/tls.key), reloads it on demand
//     ([Store.Reload], e.g. on SIGHUP) or when the files change
//     ([Store.Watch]), and never replaces a good certificate with a bad one.
//     [Store.GetCertificate] is a lock-free atomic load suitable for
//     [tls.Config.GetCertificate].
//   - [ServerConfig] builds the server [tls.Config] (TLS 1.2 minimum, ECDHE
//     AEAD cipher suites only for TLS 1.2, TLS 1.3 enabled, ALPN), and
//     [TicketKeyRotator] rotates its session ticket keys.
//   - [Authority] and the helpers [WriteKeyPair] and [WriteSecretDir]
//     generate a throwaway certificate authority and leaf certificates and
//     write them to disk, including the symlink layout of a Kubernetes Secret
//     volume. They serve tests, end-to-end tests and the `applistener dev`
//     demo command; they are not meant for production certificates.
//
// The package knows nothing about routes.
package tlsconf
