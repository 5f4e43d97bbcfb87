#!/usr/bin/env bash
# Install softnic and the Debian packages of the faces asked for, on Debian or Ubuntu,
# check them with `softnic doctor`, and leave softnic on PATH for what runs next.
# The GitHub Action (action.yml), the Containerfile and .ci/run all run this script.
#
#   tools/install.sh [--faces "c rdmacm ucx mpi"] [--packages "extra debs"]
#                    [--hugepages N] [--python PYTHON] [--venv DIR] [--extras test]
#                    [--env SOFTNIC_X=value]... [--no-doctor] [--dry-run]
#
# --faces     python, c, rdmacm, system-pyverbs, ucx, mpi, middleware, tests, all
#             (softnic/cli/packages.py lists each one's Debian packages); default: c rdmacm
# --packages  more Debian packages (the programs your own tests run)
# --hugepages reserve at least N 2 MiB huge pages (vm.nr_hugepages; needs root or sudo)
# --python    the interpreter softnic runs on (3.11 or later; default: python3)
# --venv      where softnic is installed (default: .venv beside this repository's files)
# --extras    pip extras of softnic to install too (test, torch)
# --env       a SOFTNIC_* setting for the programs run later (exported, and written to
#             $GITHUB_ENV under GitHub Actions)
# --dry-run   print the packages and the commands, change nothing
#
# Afterwards the programs of later steps run on softnic through `softnic exec PROGRAM`:
# the venv's bin is printed as an `export PATH=...` line and, under GitHub Actions,
# appended to $GITHUB_PATH.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
FACES="c rdmacm"
EXTRA=""
HUGEPAGES=0
PYTHON="python3"
VENV="$REPO/.venv"
EXTRAS=""
ENVS=()
DOCTOR=1
DRY=0
while [ $# -gt 0 ]; do
    case "$1" in
        --faces) FACES="$2"; shift 2 ;;
        --packages) EXTRA="$2"; shift 2 ;;
        --hugepages) HUGEPAGES="$2"; shift 2 ;;
        --python) PYTHON="$2"; shift 2 ;;
        --venv) VENV="$2"; shift 2 ;;
        --extras) EXTRAS="$2"; shift 2 ;;
        --env) ENVS+=("$2"); shift 2 ;;
        --no-doctor) DOCTOR=0; shift ;;
        --dry-run) DRY=1; shift ;;
        -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "install.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
case "$HUGEPAGES" in ''|*[!0-9]*) echo "install.sh: --hugepages wants a number" >&2; exit 2 ;; esac
for kv in ${ENVS[@]+"${ENVS[@]}"}; do
    case "$kv" in SOFTNIC_*=*) ;; *) echo "install.sh: --env wants SOFTNIC_NAME=value, not $kv" >&2; exit 2 ;; esac
done
FACES="$(echo "$FACES" | tr ',\n' '  ')"
VENV="$(realpath -m "$VENV")"
EXTRA="$(echo "$EXTRA" | tr ',\n' '  ')"

SUDO=""
NOROOT=0        # neither root nor sudo: what is installed already is all there is
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else NOROOT=1; fi
fi
export DEBIAN_FRONTEND=noninteractive
run() {     # a command, or (--dry-run) its printout
    if [ "$DRY" -eq 1 ]; then echo "+ $*"; else "$@"; fi
}
installed() {
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"
}
UPDATED=0
apt_install() {     # the packages not installed yet, in one apt-get
    local missing=""
    for d in "$@"; do installed "$d" || missing="$missing $d"; done
    [ -z "$missing" ] && return 0
    if [ "$NOROOT" -eq 1 ] && [ "$DRY" -eq 0 ]; then
        echo "install.sh: not root and no sudo, and Debian packages are missing; as root:" \
             "apt-get install -y$missing" >&2
        exit 1
    fi
    if [ "$UPDATED" -eq 0 ]; then run $SUDO apt-get update -qq; UPDATED=1; fi
    case " $missing " in *" tshark "*)   # no question about who may capture
        if [ "$DRY" -eq 1 ]; then echo "+ debconf-set-selections: wireshark-common/install-setuid false"
        else echo "wireshark-common wireshark-common/install-setuid boolean false" \
                 | $SUDO debconf-set-selections; fi ;;
    esac
    if [ "$DRY" -eq 1 ]; then echo "+ $SUDO${SUDO:+ }apt-get install -y -qq$missing"
    else $SUDO apt-get install -y -qq $missing >/dev/null; fi
}

# 1. an interpreter to read the package list with (a bare Debian image has none)
if ! command -v python3 >/dev/null 2>&1; then
    apt_install python3 python3-venv
fi
if ! DEBS="$(python3 "$REPO/softnic/cli/packages.py" $FACES)"; then
    exit 2
fi
DEBS="$DEBS $EXTRA"
# the venv module of a Debian interpreter comes in its own package
case "$(command -v "$PYTHON" || true)" in /usr/bin/*) DEBS="python3-venv $DEBS" ;; esac
echo "faces: $FACES"
echo "Debian packages: $(echo $DEBS)"

# 2. the packages
apt_install $DEBS

# 3. huge pages (rdma-core's huge-page tests; a machine with as many keeps its setting)
if [ "$HUGEPAGES" -gt 0 ]; then
    if [ "$(cat /proc/sys/vm/nr_hugepages)" -lt "$HUGEPAGES" ]; then
        if [ "$DRY" -eq 1 ]; then echo "+ echo $HUGEPAGES | ${SUDO:+$SUDO }tee /proc/sys/vm/nr_hugepages"
        else echo "$HUGEPAGES" | $SUDO tee /proc/sys/vm/nr_hugepages >/dev/null
             echo "vm.nr_hugepages: $(cat /proc/sys/vm/nr_hugepages)"; fi
    fi
fi

# 4. softnic in a venv of the chosen interpreter
if [ "$DRY" -eq 0 ] && ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "install.sh: softnic needs Python 3.11 or later; $PYTHON is $("$PYTHON" -V 2>&1)" \
         "(give another with --python)" >&2
    exit 1
fi
SPEC="$REPO"
[ -n "$EXTRAS" ] && SPEC="$REPO[$(echo $EXTRAS | tr ' ' ',')]"
run "$PYTHON" -m venv "$VENV"
run "$VENV/bin/pip" install -q -e "$SPEC"
# its modules' bytecode, once, as pip writes it for a regular install (an editable
# one has none): every process softnic starts (a rank, a C program's interpreter)
# then loads it rather than compiling its modules again, about 0.15 s each, also
# where PYTHONDONTWRITEBYTECODE keeps processes from writing it themselves
run env -u PYTHONDONTWRITEBYTECODE "$VENV/bin/python" -m compileall -q -j 0 \
    "$REPO/softnic" "$REPO/verbs_api" "$REPO/congestion"

# 5. what works now
if [ "$DOCTOR" -eq 1 ]; then
    DARGS=()
    for f in $FACES; do DARGS+=(--face "$f"); done
    run "$VENV/bin/softnic" doctor "${DARGS[@]}"
fi

# 6. the environment of what runs next
echo "export PATH=\"$VENV/bin:\$PATH\""
for kv in ${ENVS[@]+"${ENVS[@]}"}; do echo "export ${kv%%=*}=\"${kv#*=}\""; done
if [ "$DRY" -eq 0 ]; then
    if [ -n "${GITHUB_PATH:-}" ]; then echo "$VENV/bin" >> "$GITHUB_PATH"; fi
    if [ -n "${GITHUB_ENV:-}" ]; then
        for kv in ${ENVS[@]+"${ENVS[@]}"}; do echo "$kv" >> "$GITHUB_ENV"; done
    fi
    if [ -n "${GITHUB_OUTPUT:-}" ]; then
        { echo "venv=$VENV"; echo "softnic=$VENV/bin/softnic"; } >> "$GITHUB_OUTPUT"
    fi
fi
