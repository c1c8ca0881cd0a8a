// Package tlshello is the part of TLS a server handles before, or instead
// of, a handshake: it reads a connection's ClientHello without terminating
// TLS (ReadClientHello: the SNI and ALPN, plus the exact bytes read), answers
// a peer that is refused at that stage (WriteAlert, and Refuse for a
// ClientHello that could not be read: a TLS alert or a plain-HTTP 400), and
// replays the bytes read to whoever handles the connection next
// (PrefixConn, which under crypto/tls can also collect the records of one
// large write into a single system call).
//
// The application listener (package listener), which terminates TLS after
// the lookup, and the edge (package edge), which splices the connection
// through unterminated, share it.
package tlshello
