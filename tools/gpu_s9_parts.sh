#!/usr/bin/env bash
# Cuda tests in parallel pytest processes: $PARTS is ";;"-separated groups of test paths / node ids, each group one
# process under TLIMIT s (SIGINT then, so pytest still prints its failures; KILL 20 s later); logs under $OUT (one
# file back: parts.log).  A group may open with VAR=value words: that process's environment.  A "~" in a word is a
# space (a -k expression: "-k a~or~b").  Then each
# ";;"-separated command of $CMDS, a `bash -c` of its own under CTIME s (the whole pipeline; a `cd` or a subshell
# stays in its command -- session 25: `eval "timeout ..."` took no subshell and timed only a pipeline's first part).
export CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-$PWD/.cupy_cache} PYTHONUNBUFFERED=1 PYTHONPATH=. NCCL_NVLS_ENABLE=0
export OUT=${OUT:-/tmp/out}; rm -rf /tmp/plogs; mkdir -p $OUT /tmp/plogs     # (a warm machine keeps /tmp)
start=$(date +%s)
i=0
IFS=$'\n'; for grp in $(echo "$PARTS" | sed 's/;;/\n/g'); do
  i=$((i+1)); IFS=' ' read -r -a args <<< "$grp"
  args=("${args[@]//\~/ }")
  envs=(); while [[ ${#args[@]} -gt 0 && ${args[0]} == [A-Z]*=* ]]; do envs+=("${args[0]}"); args=("${args[@]:1}"); done
  ( timeout -s INT -k 20 ${TLIMIT:-450} env "${envs[@]}" python3 -m pytest -q -m cuda -p no:cacheprovider -rf --maxfail=30 "${args[@]}" \
      > /tmp/plogs/p$i.log 2>&1; echo "rc $? after $(( $(date +%s) - start )) s" >> /tmp/plogs/p$i.log ) &
done
wait
if ls /tmp/plogs/p*.log > /dev/null 2>&1; then      # (no PARTS: no logs)
  for f in /tmp/plogs/p*.log; do echo "$(basename $f): $(grep -E 'passed|failed' $f | tail -1) $(tail -1 $f)"; done
  grep -hE "^(FAILED|ERROR)" /tmp/plogs/p*.log | head -30
  cat /tmp/plogs/p*.log > $OUT/parts.log
fi
j=0
IFS=$'\n'; for c in $(echo "$CMDS" | sed 's/;;/\n/g'); do
  j=$((j+1)); timeout ${CTIME:-150} bash -c "$c" > $OUT/cmd$j.log 2>&1
  echo "== cmd$j rc=$? ($(( $(date +%s) - start )) s): $c"; grep -v -i warn $OUT/cmd$j.log | tail -${TAIL:-30}
done
echo "total: $(( $(date +%s) - start )) s"
