#!/usr/bin/env bash
# scripts/run.sh — the main job: install what is missing, build, and train the
# bundled model on the bundled dataset with a local swarm that churns.
#
#   scripts/run.sh [ITERATIONS] [extra `gwtf swarm` options...]   (default 40)
#
# Two data nodes and eight relays, each its own `gwtf node` process on
# 127.0.0.1, train the `tiny` GPT (0.84M parameters, 3 pipeline stages) on
# Moby Dick (scripts/fetch_data.sh; a synthetic corpus where it cannot be
# fetched). Links are emulated from the 8-city latency/bandwidth table
# (data/links/cities8.json: ports 7000.. spread over Oregon, Virginia, Tokyo,
# London, ...), and every relay is killed with probability 0.1 per iteration
# and restarted with a fresh identity, so you watch the flows re-route,
# backward passes get repaired and newcomers download their stage's weights
# while the loss falls. The merged log stream is on screen; Ctrl-C stops the
# swarm cleanly. The data nodes hold out the last 5 % of the text and log the
# validation loss every 10 iterations (eval.done). A summary (loss and
# validation loss per iteration, crashes, repairs, tokens/s) ends the run and
# is also written to build/swarm-summary.json. The peers' data dirs are kept
# in build/demo/.
#
# While it runs, open the live view it prints (http://127.0.0.1:8080/: stages
# and members, flows, loss, a timeline of crashes and repairs; docs/WEB.md).
# GWTF_HTTP_PORT=PORT serves it elsewhere, GWTF_HTTP_PORT=off not at all.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
iterations=40
if [ $# -gt 0 ] && [[ "$1" =~ ^[0-9]+$ ]]; then
  iterations=$1
  shift
fi

"$here/scripts/setup.sh"
gwtf="$here/build/node/gwtf"
dataset=$("$here/scripts/fetch_data.sh" "$gwtf")

http_port=${GWTF_HTTP_PORT:-8080}
http=()
if [ "$http_port" != off ]; then
  http=(--http "$http_port")
fi

echo "== gwtf swarm: 2 data nodes, 8 relays, 3 stages, $iterations iterations, churn 0.1, links of 8 cities" >&2
if [ "$http_port" != off ]; then
  echo "== watch it live: open http://127.0.0.1:$http_port/" >&2
fi
# Fresh peer data dirs for every run.
workdir="$here/build/demo"
rm -rf "$workdir"
exec "$gwtf" swarm "${http[@]}" --dataset "$dataset" --model tiny --data-nodes 2 --relays 8 --stages 3 \
  --iterations "$iterations" --churn 0.1 --links "$here/data/links/cities8.json" --base-port 7000 \
  --val-fraction 0.05 --eval-every 10 --workdir "$workdir" \
  --summary-json "$here/build/swarm-summary.json" "$@"
