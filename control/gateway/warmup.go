package gateway

import "time"

// endWarmupIfCompleteLocked ends a memory store's discovery warmup
// (Config.DiscoveryWarmup) early, once the view holds everything it can
// hold: every supervisor that a document grants routes is back with a
// session that holds and an advertisement made in it. Until then a
// supervisor that still serves routes may not have come back, and a 200
// would withdraw them at every consumer; once they are all back, waiting
// longer only keeps the consumers from the renewals, and an edge whose
// cached routes expire during the warmup drops live traffic (a 20 s
// outage plus a 17 s warmup is past the default 30 s freshness). A
// supervisor that never comes back keeps the full warmup. d.mu is held.
func (d *discoveryService) endWarmupIfCompleteLocked(v *discoveryView) {
	until := d.warmUntil.Load()
	if until == 0 || v.state == nil || v.unusable != "" {
		return
	}
	now := time.Now()
	if now.UnixNano() >= until {
		return
	}
	for sup, grants := range v.state.grants {
		if len(grants) == 0 {
			continue
		}
		s, ok := v.sessions[sup]
		if !ok || !s.holds() {
			return
		}
		if adv, ok := v.installations[sup]; !ok || adv.session != s.rec.Session {
			return
		}
	}
	if d.warmUntil.CompareAndSwap(until, 0) {
		d.log.Info("discovery warmup ended early: every supervisor with a document is back with its session and advertisement",
			"left", time.Unix(0, until).Sub(now).Round(time.Millisecond), "supervisors", len(v.state.grants))
	}
}
