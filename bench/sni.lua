-- wrk script: connect to 127.0.0.1 (or $BENCH_CONNECT) whatever the URL's
-- host is, so the URL host (team--demo--web.apps.test) is still sent as the
-- TLS SNI and the Host header without an /etc/hosts entry.
local connect_host = os.getenv("BENCH_CONNECT") or "127.0.0.1"

function wrk.resolve(host, service)
   local addrs = wrk.lookup(connect_host, service)
   for i = #addrs, 1, -1 do
      if not wrk.connect(addrs[i]) then
         table.remove(addrs, i)
      end
   end
   wrk.addrs = addrs
end
