# Sourced by the GPU sweep scripts: `run NAME LIMIT_S COMMAND...` runs one process under a time
# limit, keeps its whole output in $OUT/NAME.log whatever happens (exit status and seconds on the
# last line) and prints its last lines without the JSON result.
run() {
    local name=$1 limit=$2; shift 2
    echo "== $name: $*"
    local start=$SECONDS
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
    echo "(exit $?, $((SECONDS - start)) s)" >> "$OUT/$name.log"
    grep -v "^{" "$OUT/$name.log" | grep -v "^    instead" | tail -n "${RUN_TAIL:-8}"
}
