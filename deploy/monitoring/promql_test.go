package monitoring_test

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// This file extracts the metric names a PromQL expression selects, without
// a PromQL parser dependency: string literals, label matchers ({...}),
// ranges and subqueries ([...]) and label lists of by/without/on/ignoring/
// group_left/group_right are skipped; an identifier followed by "(" is a
// function or aggregation; keywords are skipped; every other identifier is a
// metric name. {__name__="x"} selects x. Grafana's label_values(metric,
// label) and $variables are understood.

// promqlKeywords are identifiers that are never metric names (operators,
// modifiers and the literals inf/nan).
var promqlKeywords = map[string]bool{
	"and": true, "or": true, "unless": true, "bool": true, "offset": true,
	"by": true, "without": true, "on": true, "ignoring": true,
	"group_left": true, "group_right": true, "inf": true, "nan": true,
	"atan2": true,
}

// labelListKeywords are followed by a parenthesised list of label names.
var labelListKeywords = map[string]bool{
	"by": true, "without": true, "on": true, "ignoring": true,
	"group_left": true, "group_right": true,
}

func isIdentStart(c byte) bool {
	return c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

func isIdentChar(c byte) bool {
	return isIdentStart(c) || c >= '0' && c <= '9'
}

// skipString returns the index after the string literal starting at s[i].
func skipString(s string, i int) (int, error) {
	q := s[i]
	for j := i + 1; j < len(s); j++ {
		switch {
		case s[j] == '\\' && q != '`':
			j++
		case s[j] == q:
			return j + 1, nil
		}
	}
	return 0, fmt.Errorf("unterminated string at offset %d", i)
}

// readString returns the value of the string literal at s[i] (escapes
// kept as written, enough for metric names) and the index after it.
func readString(s string, i int) (string, int, error) {
	end, err := skipString(s, i)
	if err != nil {
		return "", 0, err
	}
	return s[i+1 : end-1], end, nil
}

// nextWord returns the identifier starting at s[i] ("" if none).
func nextWord(s string, i int) string {
	j := i
	for j < len(s) && isIdentChar(s[j]) {
		j++
	}
	if j == i || !isIdentStart(s[i]) {
		return ""
	}
	return s[i:j]
}

func skipSpace(s string, i int) int {
	for i < len(s) && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r') {
		i++
	}
	return i
}

// matchers reads the label matchers starting at s[i] == '{' and returns
// the metric name of a __name__="x" matcher ("" if none), the other
// labels matched and the index after the closing brace.
func matchers(s string, i int) (name string, labels []string, _ int, _ error) {
	j := i + 1
	for {
		j = skipSpace(s, j)
		if j >= len(s) {
			return "", nil, 0, fmt.Errorf("unterminated label matchers at offset %d", i)
		}
		switch c := s[j]; {
		case c == '}':
			return name, labels, j + 1, nil
		case c == ',':
			j++
		case c == '"' || c == '\'' || c == '`':
			// A quoted metric name (Prometheus 3: {"name"}) or label.
			v, end, err := readString(s, j)
			if err != nil {
				return "", nil, 0, err
			}
			k := skipSpace(s, end)
			if k < len(s) && (s[k] == '}' || s[k] == ',') {
				name = v
			}
			j = end
		case isIdentStart(c):
			k := j
			for k < len(s) && isIdentChar(s[k]) {
				k++
			}
			label := s[j:k]
			k = skipSpace(s, k)
			op := ""
			for k < len(s) && strings.IndexByte("=!~", s[k]) >= 0 {
				op += string(s[k])
				k++
			}
			k = skipSpace(s, k)
			if op == "" || k >= len(s) || strings.IndexByte("\"'`", s[k]) < 0 {
				return "", nil, 0, fmt.Errorf("bad label matcher %q at offset %d", s[j:min(k+1, len(s))], j)
			}
			v, end, err := readString(s, k)
			if err != nil {
				return "", nil, 0, err
			}
			switch {
			case label == "__name__" && op == "=":
				name = v
			case label != "__name__":
				labels = append(labels, label)
			}
			j = end
		default:
			return "", nil, 0, fmt.Errorf("unexpected %q in label matchers at offset %d", c, j)
		}
	}
}

// selector is a metric name and the labels its matchers name.
type selector struct {
	name   string
	labels []string
}

// exprInfo is what parseExpr finds in an expression: its selectors and
// the labels of its by/without/on/ignoring/group_left/group_right lists.
type exprInfo struct {
	selectors []selector
	grouping  []string
}

// metricNames returns the metric names expr selects, in order of first use.
func metricNames(expr string) ([]string, error) {
	info, err := parseExpr(expr)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, sel := range info.selectors {
		if sel.name != "" && !slices.Contains(names, sel.name) {
			names = append(names, sel.name)
		}
	}
	return names, nil
}

func parseExpr(expr string) (exprInfo, error) {
	var info exprInfo
	afterName := -1 // index just after the last metric name, for its {matchers}
	depth := 0
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == '"' || c == '\'' || c == '`':
			end, err := skipString(expr, i)
			if err != nil {
				return info, err
			}
			i = end
		case c == '#': // comment to the end of the line
			for i < len(expr) && expr[i] != '\n' {
				i++
			}
		case c == '{':
			n, labels, end, err := matchers(expr, i)
			if err != nil {
				return info, err
			}
			if n == "" && afterName >= 0 && strings.TrimSpace(expr[afterName:i]) == "" {
				// name{...}: the matchers of the name just read.
				last := &info.selectors[len(info.selectors)-1]
				last.labels = append(last.labels, labels...)
			} else {
				info.selectors = append(info.selectors, selector{name: n, labels: labels})
			}
			i = end
		case c == '[':
			end := strings.IndexByte(expr[i:], ']')
			if end < 0 {
				return info, fmt.Errorf("unterminated [ at offset %d", i)
			}
			i += end + 1
		case c == '$': // a Grafana variable: $name, ${name}, $__rate_interval
			i++
			if i < len(expr) && expr[i] == '{' {
				end := strings.IndexByte(expr[i:], '}')
				if end < 0 {
					return info, fmt.Errorf("unterminated ${ at offset %d", i)
				}
				i += end + 1
				continue
			}
			for i < len(expr) && isIdentChar(expr[i]) {
				i++
			}
		case c >= '0' && c <= '9' || c == '.' && i+1 < len(expr) && expr[i+1] >= '0' && expr[i+1] <= '9':
			// Numbers and durations (5m, 1h30m, 0x1f, 1e3, 0.5).
			for i < len(expr) && (isIdentChar(expr[i]) || expr[i] == '.') {
				i++
			}
		case isIdentStart(c):
			j := i
			for j < len(expr) && isIdentChar(expr[j]) {
				j++
			}
			word := expr[i:j]
			k := skipSpace(expr, j)
			switch {
			case labelListKeywords[word] && k < len(expr) && expr[k] == '(':
				end := strings.IndexByte(expr[k:], ')')
				if end < 0 {
					return info, fmt.Errorf("unterminated label list after %s", word)
				}
				for _, l := range strings.Split(expr[k+1:k+end], ",") {
					if l = strings.TrimSpace(l); l != "" {
						info.grouping = append(info.grouping, l)
					}
				}
				j = k + end + 1
			case promqlKeywords[word]:
			case k < len(expr) && expr[k] == '(':
				// A function or an aggregation.
			case nextWord(expr, k) == "by" || nextWord(expr, k) == "without":
				// An aggregation with its labels first: sum by (x) (...).
			default:
				info.selectors = append(info.selectors, selector{name: word})
				afterName = j
			}
			i = j
		default:
			switch c {
			case '(':
				depth++
			case ')':
				depth--
				if depth < 0 {
					return info, fmt.Errorf("unbalanced ) at offset %d", i)
				}
			}
			i++
		}
	}
	if depth != 0 {
		return info, fmt.Errorf("unbalanced parentheses")
	}
	return info, nil
}

// grafanaQueryNames returns the metric names of a Grafana Prometheus
// query: a PromQL expression, or a templating function
// (label_values(metric, label), label_values(label), metrics(re),
// query_result(expr)).
func grafanaQueryNames(q string) ([]string, error) {
	q = strings.TrimSpace(q)
	switch {
	case strings.HasPrefix(q, "label_values(") && strings.HasSuffix(q, ")"):
		args := q[len("label_values(") : len(q)-1]
		i := strings.LastIndexByte(args, ',')
		if i < 0 {
			return nil, nil // label_values(label): no metric
		}
		return metricNames(args[:i])
	case strings.HasPrefix(q, "query_result(") && strings.HasSuffix(q, ")"):
		return metricNames(q[len("query_result(") : len(q)-1])
	case strings.HasPrefix(q, "metrics(") || strings.HasPrefix(q, "label_names("):
		return nil, nil
	}
	return metricNames(q)
}

func TestMetricNamesExtraction(t *testing.T) {
	for _, c := range []struct {
		expr string
		want []string
	}{
		{`up`, []string{"up"}},
		{`time() - applistener_config_last_success_timestamp_seconds > 30`, []string{"applistener_config_last_success_timestamp_seconds"}},
		{`sum by (namespace, pod) (rate(applistener_requests_total{code="5xx", x=~"a{b}[c]"}[5m])) / ignoring(code) group_left sum without (code) (rate(applistener_requests_total[5m] offset 1h))`,
			[]string{"applistener_requests_total"}},
		{`histogram_quantile(0.99, sum by (le) (rate(applistener_revocation_close_seconds_bucket[5m])))`, []string{"applistener_revocation_close_seconds_bucket"}},
		{`a_metric and on(instance) b_metric or c_metric unless bool d:recorded`, []string{"a_metric", "b_metric", "c_metric", "d:recorded"}},
		{`{__name__="applistener_routes", job="x"} + {"applistener_streams_active"}`, []string{"applistener_routes", "applistener_streams_active"}},
		{`label_replace(applistener_routes, "dst", "$1", "src", "(applistener_typo)")`, []string{"applistener_routes"}},
		{`topk(10, sum by (workspace) (applistener_instance_streams_active{instance=~"$instance"})) * 1e3 + 0x10`, []string{"applistener_instance_streams_active"}},
		{`rate(applistener_bytes_total[$__rate_interval]) > ${threshold}`, []string{"applistener_bytes_total"}},
		{`certmanager_certificate_expiration_timestamp_seconds - time() < 14 * 86400`, []string{"certmanager_certificate_expiration_timestamp_seconds"}},
		{`rate(foo[5m:30s]) # comment naming not_a_metric`, []string{"foo"}},
	} {
		got, err := metricNames(c.expr)
		if err != nil {
			t.Errorf("metricNames(%q): %v", c.expr, err)
			continue
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("metricNames(%q) = %q, want %q", c.expr, got, c.want)
		}
	}
	info, err := parseExpr(`sum by (code, pod) (rate(a_total{code="5xx", le=~".+"}[5m])) / on(pod) group_left() b{job="x"} + {__name__="c", d!="e"}`)
	if err != nil {
		t.Fatal(err)
	}
	want := exprInfo{
		selectors: []selector{{"a_total", []string{"code", "le"}}, {"b", []string{"job"}}, {"c", []string{"d"}}},
		grouping:  []string{"code", "pod", "pod"},
	}
	if !reflect.DeepEqual(info, want) {
		t.Errorf("parseExpr = %+v, want %+v", info, want)
	}
	for _, bad := range []string{`rate(x[5m]`, `x{a="b"`, `x{a}`, `sum(x))`, `x{a="b}`} {
		if got, err := metricNames(bad); err == nil {
			t.Errorf("metricNames(%q) = %q, want an error", bad, got)
		}
	}
	for q, want := range map[string][]string{
		`label_values(applistener_routes{job="a"}, instance)`:  {"applistener_routes"},
		`label_values({__name__=~"applistener_.+"}, instance)`: nil,
		`label_values(instance)`:                               nil,
		`query_result(topk(5, applistener_routes))`:            {"applistener_routes"},
	} {
		got, err := grafanaQueryNames(q)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("grafanaQueryNames(%q) = %q, %v; want %q", q, got, err, want)
		}
	}
}
