// Package accesstoken mints and verifies the access tokens of private
// services: short HMAC-SHA256 tokens a platform mints with a key it shares
// with the listener, bound to one sandbox (and optionally one of its
// services), with a mandatory expiry, an optional subject and a policy
// generation.
//
// A token is four dot-separated parts, all URL-safe:
//
//	v1.<key id>.<base64url payload>.<base64url HMAC-SHA256>
//
// The MAC covers "v1.<key id>.<payload>" exactly as written. The payload is
// binary: a flags byte (bit 0: bound to one service), the issue time, the
// expiry and the generation as minimal unsigned varints (Unix seconds for
// the times), then the workspace, sandbox, service and subject, each as a
// length byte and its bytes. Every token has exactly one encoding: a token
// verifies only if it is byte for byte what Mint produced for its claims.
//
// Verify refuses a malformed or oversized token before decoding anything,
// compares the MAC in constant time and, on the warm path, allocates
// nothing. Its errors (ErrMalformed, ErrUnknownKey, ErrBadSignature,
// ErrExpired, ErrNotYetValid, ErrLifetime, ErrWrongScope, ErrRevoked)
// never contain the token.
//
// The keys file shared by the platform and the listener is
// {"keys":[{"id":"k1","secret":"<standard base64 of at least 32 bytes>"}]}
// (ParseKeysFile); several ids may be listed at once for rotation.
package accesstoken
