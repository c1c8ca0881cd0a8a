package main

import (
	"errors"
	"strings"
	"testing"
)

// The gateway's store, session and policy flags: what is accepted and the
// one-line usage error of what is not.
func TestGatewayFlags(t *testing.T) {
	base := []string{"--address", "127.0.0.1:0", "--tokens", "t.json"}
	for _, c := range []struct {
		name string
		args []string
		want string // "" when accepted
	}{
		{"memory needs --config", nil, "--config is required with --store memory"},
		{"memory", []string{"--config", "g.json"}, ""},
		{"etcd without --config", []string{"--store", "etcd", "--etcd-endpoints", "http://127.0.0.1:2379"}, ""},
		{"etcd, several endpoints and TLS", []string{"--store", "etcd", "--etcd-endpoints", "https://a:2379, https://b:2379",
			"--etcd-ca-file", "ca.pem", "--etcd-cert-file", "c.pem", "--etcd-key-file", "k.pem", "--etcd-prefix", "/gw/"}, ""},
		{"etcd without endpoints", []string{"--store", "etcd"}, "--etcd-endpoints is required"},
		{"etcd endpoint not a URL", []string{"--store", "etcd", "--etcd-endpoints", "127.0.0.1:2379"}, "not an http(s)://HOST:PORT URL"},
		{"etcd cert without key", []string{"--store", "etcd", "--etcd-endpoints", "http://a:2379", "--etcd-cert-file", "c.pem"}, "go together"},
		{"etcd prefix", []string{"--store", "etcd", "--etcd-endpoints", "http://a:2379", "--etcd-prefix", "/gw"}, "must end with /"},
		{"etcd flags with memory", []string{"--config", "g.json", "--etcd-endpoints", "http://a:2379"}, "need --store etcd"},
		{"unknown store", []string{"--store", "redis"}, "--store must be memory or etcd"},
		{"session ttl below 2 keepalives", []string{"--config", "g.json", "--session-ttl", "8s"}, "--session-ttl"},
		{"keepalive-min above keepalive", []string{"--config", "g.json", "--keepalive-min", "10s"}, "--keepalive-min"},
		{"policy source", []string{"--config", "g.json", "--endpoint-policy", "source"}, ""},
		{"policy cidr", []string{"--config", "g.json", "--endpoint-policy", "cidr:10.0.0.0/8,fd00::/8"}, ""},
		{"policy bad", []string{"--config", "g.json", "--endpoint-policy", "cidr:10.0.0.0/99"}, "--endpoint-policy"},
		{"tokens required", []string{"--tokens", ""}, "--tokens is required"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var o gatewayOptions
			err := parseCommand("gateway", append(append([]string(nil), base...), c.args...), &o)
			if c.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var ue *usageError
			if err == nil || !errors.As(err, &ue) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want a usage error containing %q", err, c.want)
			}
		})
	}
	var o gatewayOptions
	if err := parseCommand("gateway", []string{"--address", "127.0.0.1:0", "--tokens", "t", "--store", "etcd",
		"--etcd-endpoints", " http://a:1 ,,http://b:2 "}, &o); err != nil {
		t.Fatal(err)
	}
	if got := o.etcdList(); len(got) != 2 || got[0] != "http://a:1" || got[1] != "http://b:2" {
		t.Errorf("etcdList %q", got)
	}
}
