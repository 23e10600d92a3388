# scripts/bench/install_torchtitan.sh — sourced by the benchmarks that run torchtitan's own models
# (bench_train.sh, bench_moe.sh): torchtitan 0.2.2's model files only, the wheel without its
# dependencies, into .deps/torchtitan (the Python peers import them without torchtitan's training
# stack). Needs ROOT; exports TORCHTITAN_DIR. Installs once per version.
TORCHTITAN_VERSION="0.2.2"
export TORCHTITAN_DIR="$ROOT/.deps/torchtitan"
if [[ "$(cat "$TORCHTITAN_DIR/.installed" 2>/dev/null)" != "$TORCHTITAN_VERSION" ]]; then
  echo "[bench] installing torchtitan==$TORCHTITAN_VERSION into $TORCHTITAN_DIR" >&2
  rm -rf "$TORCHTITAN_DIR"
  "$ROOT/.deps/venv/bin/pip" install -q --disable-pip-version-check --no-deps --target "$TORCHTITAN_DIR" \
    "torchtitan==$TORCHTITAN_VERSION"
  echo "$TORCHTITAN_VERSION" > "$TORCHTITAN_DIR/.installed"
fi
