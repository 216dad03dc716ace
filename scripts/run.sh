#!/usr/bin/env bash
# scripts/run.sh — the main job: install what is missing, build, then run a
# local demo of three `gwtf node` peers on loopback.
#
#   scripts/run.sh [SECONDS]          (default 20; Ctrl-C ends it sooner)
#
# Peer a starts first; b and c bootstrap from it, checking a's node ID. They
# authenticate, ping each other every two seconds and log the round-trip
# times; their log streams are merged below, one prefix per peer. At the end
# every peer gets one SIGTERM and shuts down cleanly (goodbyes sent, exit 0).
# (Issue 6 replaces this demo with `gwtf swarm`, the training swarm.)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
seconds=${1:-20}
case "$seconds" in '' | *[!0-9]*) echo "usage: scripts/run.sh [SECONDS]" >&2; exit 2 ;; esac

"$here/scripts/setup.sh"
gwtf="$here/build/node/gwtf"
demo=$(mktemp -d "${TMPDIR:-/tmp}/gwtf-demo-XXXXXX")
pids=()

# Each peer runs in its own session, so a Ctrl-C reaches only this script,
# which then stops every peer exactly once; its log goes through a prefixer
# that ignores Ctrl-C, so the shutdown lines still reach the screen.
start_peer() {
  local name=$1
  shift
  setsid "$gwtf" node --listen 127.0.0.1:0 --data-dir "$demo/$name" --nat-pmp off \
    --ping-interval 2000 "$@" >"$demo/$name.out" 2> >(trap '' INT; exec sed -u "s/^/[$name] /" >&2) &
  pids+=($!)
}

stop_peers() {
  trap - INT TERM EXIT
  echo "== stopping the peers" >&2
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  local failed=0
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
  sleep 0.2 # let the prefixers print the last lines
  rm -rf "$demo"
  if [ "$failed" = 0 ]; then echo "== all peers stopped cleanly" >&2; else echo "== a peer did not exit cleanly" >&2; fi
  exit "$failed"
}
trap stop_peers INT TERM EXIT

echo "== three peers on loopback for ${seconds}s (Ctrl-C to stop sooner); state in $demo" >&2
start_peer a
# a prints how to join it ("gwtf node --bootstrap ID@ADDR"); wait for that line.
join=""
for _ in $(seq 100); do
  join=$(sed -n 's/.*--bootstrap \([0-9a-f]*@[0-9.:]*\).*/\1/p' "$demo/a.out" 2>/dev/null | head -n 1)
  [ -n "$join" ] && break
  kill -0 "${pids[0]}" 2>/dev/null || { echo "peer a did not start" >&2; exit 1; }
  sleep 0.1
done
[ -n "$join" ] || { echo "peer a did not print its address" >&2; exit 1; }
echo "[a] $(head -n 1 "$demo/a.out")" >&2
start_peer b --bootstrap "$join"
start_peer c --bootstrap "$join"

sleep "$seconds" &
wait $! || true
stop_peers
