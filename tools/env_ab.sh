#!/usr/bin/env bash
# A/B of environment settings on one command, alternated: env_ab.sh ROUNDS "A=1 B=2" "A=0" [...] -- cmd args...
# Runs the command once per setting per round (settings in turn, so slow drift of the machine hits each alike) and
# prints "== round r: <setting>" before each run's output ($GREP, if set, filters that output: grep -E).
rounds=$1; shift; sets=()
while [[ $# -gt 0 && $1 != -- ]]; do sets+=("$1"); shift; done
shift
for ((r = 1; r <= rounds; r++)); do
  for s in "${sets[@]}"; do
    echo "== round $r: ${s:-(default)}"
    if [[ -n $GREP ]]; then env $s "$@" 2>&1 | grep -E "$GREP"; else env $s "$@" 2>&1; fi
  done
done
