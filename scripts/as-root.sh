# Sourced by the scripts that need root, first thing, with their arguments:
#   . "$(dirname "$0")/as-root.sh" "$@"
# As root nothing happens. Otherwise the calling script runs again through sudo and says so; where
# sudo is not installed it stops with one line saying to run it as root.
if [ "$(id -u)" != 0 ]; then
  self="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
  if command -v sudo >/dev/null 2>&1; then
    echo "${0##*/}: not root: running it again through sudo" >&2
    exec sudo bash "$self" "$@"
  fi
  echo "${0##*/}: needs root (temperd changes other processes' scheduling) and sudo is not installed: run it as root" >&2
  exit 1
fi
