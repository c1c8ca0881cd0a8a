package accessjwt

// Freshness and ParseJWKS expose the helpers to the tests.
var Freshness = freshness

func ParseJWKS(data []byte) (map[string]string, int, error) {
	ks, skipped, err := parseJWKS(data)
	out := make(map[string]string, len(ks))
	for kid, k := range ks {
		out[kid] = k.alg
	}
	return out, skipped, err
}
