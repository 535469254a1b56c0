# Sourced by the GPU scripts: installs the carried wheels (Textual, tomli-w) that the GPU
# machine lacks and puts them and the checkout on the import path; results go to $OUT.
# pythonpath/ gives the checkout's kernels/ folder its installed name, gputune_kernels.
OUT=${OUT:-out}; mkdir -p "$OUT"
if [ -d .whl ] && [ -z "${GPUTUNE_WHEELS_INSTALLED:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD GPUTUNE_WHEELS_INSTALLED=1
fi
case ":${PYTHONPATH:-}:" in
  *":$PWD/pythonpath:"*) ;;
  *) export PYTHONPATH=$PWD:$PWD/pythonpath${PYTHONPATH:+:$PYTHONPATH} ;;
esac
export PYTHONUNBUFFERED=1
