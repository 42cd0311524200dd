#!/usr/bin/env bash
# A transcript of `bw24chat serve` answering curl: starts the server (the fake engine unless
# MODEL is set: MODEL=path/to.gguf DEVICE=cpu tools/serve_transcript.sh) on a free loopback port,
# shows each request and its answer, then stops it.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$tmp"' EXIT
if [[ -n "${MODEL:-}" ]]; then engine=(-m "$MODEL" --device "${DEVICE:-auto}"); else engine=(--fake --fake-echo); fi
python3 -m bw24chat.server "${engine[@]}" --port 0 --port-file "$tmp/port" --log-level warning 2>"$tmp/log" &
pid=$!
for _ in $(seq 600); do [[ -s "$tmp/port" ]] && curl -sf "http://127.0.0.1:$(cat "$tmp/port")/health" >/dev/null && break; sleep 0.5; done
base="http://127.0.0.1:$(cat "$tmp/port")"
run() { echo "\$ curl $*"; curl -s "$@"; echo; echo; }
run "$base/health"
run "$base/v1/models"
# requests name the served id (or an alias such as "default"); any other gets 404 model_not_found
id=$(curl -s "$base/v1/models" | python3 -c 'import json, sys; print(json.load(sys.stdin)["data"][0]["id"])')
run "$base/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"model":"'"$id"'","messages":[{"role":"user","content":"Say hi."}],"max_tokens":16,"temperature":0}'
run -N "$base/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"model":"'"$id"'","messages":[{"role":"user","content":"Stream it."}],"max_tokens":8,"stream":true,"stream_options":{"include_usage":true}}'
run "$base/v1/completions" -H 'Content-Type: application/json' \
  -d '{"model":"'"$id"'","prompt":"The capital of France is","max_tokens":6,"temperature":0,"logprobs":1}'
run "$base/v1/chat/completions" -H 'Content-Type: application/json' -d '{"model":"'"$id"'","messages":[],"n":2}'
run "$base/v1/chat/completions" -H 'Content-Type: application/json' -d '{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}'
run "$base/metrics"
