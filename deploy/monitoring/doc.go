// Package monitoring holds the tests of the Prometheus alert rules
// (deploy/prometheus) and the Grafana dashboard (deploy/grafana). They parse
// every PromQL expression and check each metric name against what the built
// `applistener` binary exports (serve, gateway and edge, started on loopback
// and scraped), and, when promtool is available (from PATH, or built once
// with `go install` into the user cache directory), run `promtool check
// rules` and the rule unit tests.
package monitoring
