package dispatch

import (
	"net"
	"runtime"
	"testing"
	"time"
)

// BenchmarkBackendPool takes an idle app connection from a route's pool and
// gives it back, from many goroutines at once (64 per GOMAXPROCS, as many
// connections idle): the cost of the pool's lock when every request of a
// busy route goes through it.
//
//	go test -run XXX -bench BackendPool -cpu 1,2,4,8 -benchmem ./dispatch/
func BenchmarkBackendPool(b *testing.B) {
	const par = 64
	p := &backendPool{maxIdle: 1 << 20, idleTimeout: time.Hour, bufPool: newTestPool(64)}
	var peers []net.Conn
	for range runtime.GOMAXPROCS(0) * par {
		c, peer := net.Pipe()
		peers = append(peers, peer)
		p.put(&backendConn{conn: c, in: inbuf{src: c, pool: p.bufPool}})
	}
	defer func() {
		p.Revoke(nil)
		for _, c := range peers {
			_ = c.Close()
		}
	}()
	b.ReportAllocs()
	b.SetParallelism(par)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			bc := p.get()
			if bc == nil {
				b.Error("no idle connection")
				return
			}
			p.put(bc)
		}
	})
}

// BenchmarkManyClients is BenchmarkProtocols with 200 client workers per
// GOMAXPROCS (400 on two cores) instead of 8: more requests in flight than
// a small idle bound keeps connections for, the wrk -c400 and
// h2load -c4 -m100 case of bench/run.sh. dials/1k-req is how many app
// connections the listener opened per 1,000 requests after the warm-up.
//
//	go test -run XXX -bench ManyClients -benchmem ./dispatch/
func BenchmarkManyClients(b *testing.B) {
	for _, proto := range []string{"http1", "http2"} {
		b.Run(proto, func(b *testing.B) { benchProtocol(b, proto, benchHistograms, 200) })
	}
}
