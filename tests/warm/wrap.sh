#!/usr/bin/env bash
# wrap.sh COMMAND ARG...: COMMAND (mpirun, srun) with the first `PYTHON [-u] -m MODULE` in its
# arguments started through the warm zygote's client, PYTHON being the zygote's own interpreter
# (HPCTRAIN_TEST_ZYGOTE_PYTHON); unchanged where no zygote runs or the command starts another
# (a container's Python) or runs no module.
args=("$@")
if [ -S "${HPCTRAIN_TEST_ZYGOTE:-}" ] && [ -n "${HPCTRAIN_TEST_ZYGOTE_PYTHON:-}" ]; then
  for ((i = 0; i < ${#args[@]}; i++)); do
    [ "${args[i]}" = "$HPCTRAIN_TEST_ZYGOTE_PYTHON" ] || continue
    next=${args[i + 1]:-} after=${args[i + 2]:-}
    if [ "$next" = -m ] || { [ "$next" = -u ] && [ "$after" = -m ]; }; then
      client=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/client.py
      args=("${args[@]:0:i+1}" -I -S "$client" "${args[@]:i+1}")
    fi
    break
  done
fi
exec "${args[@]}"
