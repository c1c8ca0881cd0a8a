// Package monitoring holds the tests of the Prometheus alert rules
// (deploy/prometheus) and the Grafana dashboard (deploy/grafana). They parse
// every PromQL expression and check each metric name, and the label names of
// its matchers and by/without lists, against what the built `applistener`
// binary exports (serve with some traffic, gateway and edge, started on
// loopback and scraped), and, when promtool is available (from PATH, or
// built once with `go install` into the user cache directory), run
// `promtool check rules` and the rule unit tests.
package monitoring
