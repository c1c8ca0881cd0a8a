#!/usr/bin/env python3
"""noisy_join.py PREFIX: where a quiet request's time went under a flood.

Joins the quiet client's requests (PREFIX.quiet.tsv, written by
`loadgen quiet -log`: host, send and done times in Unix ns, status) with
the proxy's access-log lines for the same hosts (PREFIX.access), both
written by bench/run.sh with BENCH_NOISY_PROFILE=1. Requests on one
keep-alive connection are sequential, so the n-th request a host sent is
the n-th access line of that host whose span fits inside it.

For each request:
  before  until the proxy began the request (its head read): the client's
          write, the kernel, and the proxy's delivery of the connection
          (parked with the idle poller, or waiting in Go's poller)
  proxy   the access log's duration (head read to the request's end,
          taken after its response is written)
  rest    from the head read to the client's read of the response (the
          access line's end comes after the write, and a client that runs
          above the proxy may read before it: proxy can exceed rest)
Prints the p50/p90/p99/max of each and of the total, and the slowest 1 %
of requests split the same way (where the tail comes from).
"""
import re
import sys
from collections import defaultdict

ACCESS = re.compile(r'time=(\S+) .* host=(\S+) .* duration=([\d.]+)')


def parse_time(ts):
    # 2026-12-07T23:08:23.815140Z -> Unix ns (UTC)
    import datetime
    date, frac = ts.rstrip('Z').split('.') if '.' in ts else (ts.rstrip('Z'), '0')
    dt = datetime.datetime.strptime(date, '%Y-%m-%dT%H:%M:%S').replace(tzinfo=datetime.timezone.utc)
    return int(dt.timestamp()) * 10**9 + int(frac.ljust(9, '0')[:9])


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(len(v) * p))] if v else 0


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    prefix = sys.argv[1]
    sent = defaultdict(list)
    with open(prefix + '.quiet.tsv') as f:
        for line in f:
            host, s, d, _ = line.split('\t')
            sent[host].append((int(s), int(d)))
    spans = defaultdict(list)
    with open(prefix + '.access') as f:
        for line in f:
            m = ACCESS.search(line)
            if not m:
                continue
            end = parse_time(m.group(1))
            dur = int(float(m.group(3)) * 1e9)
            spans[m.group(2)].append((end - dur, end))
    rows = []
    for host, reqs in sent.items():
        acc = sorted(spans.get(host, []))
        j = 0
        for s, d in reqs:
            # The first access span that starts after the send (the log's
            # clock has microseconds; allow one).
            while j < len(acc) and acc[j][0] < s - 1000:
                j += 1
            if j == len(acc):
                break
            a0, a1 = acc[j]
            if a0 > d + 1000:
                continue  # the proxy began no request within this one
            rows.append((d - s, a0 - s, a1 - a0, d - a0))
            j += 1
    if not rows:
        sys.exit('nothing joined')
    print(f'{len(rows)} of {sum(len(v) for v in sent.values())} requests joined')
    names = ('total', 'before', 'proxy', 'rest')
    print('%-7s %9s %9s %9s %9s  (ms)' % ('', 'p50', 'p90', 'p99', 'max'))
    for k, n in enumerate(names):
        v = [r[k] / 1e6 for r in rows]
        print('%-7s %9.3f %9.3f %9.3f %9.3f' % (n, pct(v, .5), pct(v, .9), pct(v, .99), max(v)))
    tail = sorted(rows)[-max(1, len(rows) // 100):]
    print(f'slowest {len(tail)}: mean ms ' + ', '.join(
        '%s %.3f' % (n, sum(r[k] for r in tail) / len(tail) / 1e6) for k, n in enumerate(names)))


if __name__ == '__main__':
    main()
