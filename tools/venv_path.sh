# Sourced by tools/setup_env.sh, test.sh and the recipe: the ESPnet release to use
# ($ESPNET_VERSION: 202511, the default, or 202611) and the virtual environment that
# holds it ($VENV if set; else .venv for 202511, .venv-espnet202611 for 202611).
ESPNET_VERSION=${ESPNET_VERSION:-202511}
case "$ESPNET_VERSION" in
  202511 | 202611) ;;
  *)
    echo "ESPNET_VERSION=$ESPNET_VERSION: espnet-multiblank supports and tests ESPnet" \
      "202511 and 202611" >&2
    return 2 2>/dev/null || exit 2
    ;;
esac
_espnet_mb_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [ -z "${VENV:-}" ]; then
  if [ "$ESPNET_VERSION" = 202511 ]; then
    VENV=$_espnet_mb_root/.venv
  else
    VENV=$_espnet_mb_root/.venv-espnet$ESPNET_VERSION
  fi
fi
export ESPNET_VERSION VENV
