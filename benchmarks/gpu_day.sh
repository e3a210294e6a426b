#!/usr/bin/env bash
# The GPU check in three steps, for a GPU machine with torch but no network (docs/guide/accelerator.md, "Checking a GPU"):
#
#   DISTRIBUTED_SHAMPOO_SRC=DIR bash benchmarks/gpu_day.sh fetch   # here, where pip reaches the
#                                                    # package registry: the wheels the GPU machine
#                                                    # lacks, into .whl/, and Meta's Distributed Shampoo
#                                                    # built from DIR, a checkout of
#                                                    # github.com/facebookresearch/optimizers (not on
#                                                    # PyPI; without DIR its rows say it is missing)
#   bash benchmarks/gpu_day.sh check                 # here, before the GPU machine starts: every
#                                                    # wheel, Distributed Shampoo's too, is in .whl/
#                                                    # (exit 2 names the missing)
#   bash benchmarks/gpu_day.sh run OUT [BUDGET] [ARGS...]  # there: installs them into a temporary
#                                                    # site directory, runs benchmarks/gpu_check.py
#
# `run` writes OUT/gpu_check.md (every row as it completes) and OUT/gpu_check.log, and exits with
# the check's status (1 when a check failed). BUDGET (seconds; default 420 on a GPU, none in a
# dry run) is when the check stops starting new rows and cuts a running one; ARGS go to
# gpu_check.py (--dry-run checks this script on a CPU).
# GPU_PYTHON (default 3.12, the GPU image's) is the Python the wheels are fetched for.
set -euo pipefail
caller=$PWD
cd "$(dirname "$0")/.."
WHEELS=.whl
PYTHON=${PYTHON:-python3}
# tensordict as CI tests it (pyproject.toml) and the one requirement the GPU image lacks
# (it ships numpy and cloudpickle); both are pure Python, which `run` relies on
WANTED=("tensordict==0.15.3" "pyvers>=0.2,<0.3")

# the wheel files `run` requires, one pattern each; `check` (a GPU day) wants Distributed
# Shampoo's too, whose rows a run without it reports as missing
NEEDED=("tensordict-0.15.3-*.whl" "pyvers-*.whl")
SHAMPOO="torch_shampoo-*-py3-none-any.whl"

missing_wheels() {
    local pattern
    for pattern in "$@"; do
        compgen -G "$WHEELS/$pattern" > /dev/null || echo "$pattern"
    done
}

case "${1:-}" in
check)
    missing=$(missing_wheels "${NEEDED[@]}" "$SHAMPOO" | tr "\n" " ")
    if [[ -n $missing ]]; then
        echo "gpu_day.sh: missing in $WHEELS: $missing; run 'bash benchmarks/gpu_day.sh fetch' where pip works" >&2
        exit 2
    fi
    echo "gpu_day.sh: every wheel is in $WHEELS"
    ;;
fetch)
    mkdir -p "$WHEELS"
    if [[ -n ${DISTRIBUTED_SHAMPOO_SRC:-} ]]; then
        # pure Python; its metadata asks for Python 3.12 (the GPU image's), so the build here ignores that
        PIP_CONSTRAINT=/dev/null "$PYTHON" -m pip wheel -q --no-deps --no-build-isolation --ignore-requires-python \
            -w "$WHEELS" "$DISTRIBUTED_SHAMPOO_SRC"
    else
        echo "gpu_day.sh: DISTRIBUTED_SHAMPOO_SRC is not set: no Distributed Shampoo wheel (its rows will say so)" >&2
    fi
    PIP_CONSTRAINT=/dev/null "$PYTHON" -m pip download -q --no-deps --only-binary=:all: \
        --python-version "${GPU_PYTHON:-3.12}" --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$WHEELS" "${WANTED[@]}"
    ls -l "$WHEELS"
    ;;
run)
    out=${2:?usage: gpu_day.sh run OUT [BUDGET] [gpu_check.py arguments]}
    [[ $out = /* ]] || out=$caller/$out
    budget=()  # none given: gpu_check.py's own (420 s on a GPU, none in a dry run)
    if [[ ${3:-} =~ ^[0-9]+$ ]]; then
        budget=(--budget "$3")
        shift 3
    else
        shift 2
    fi
    mkdir -p "$out"
    "$PYTHON" -c "import torch, numpy, cloudpickle" || {
        echo "gpu_day.sh: $PYTHON lacks torch, numpy or cloudpickle: fetch them as wheels too" >&2
        exit 2
    }
    missing=$(missing_wheels "${NEEDED[@]}" | tr "\n" " ")
    [[ -z $missing ]] || {
        echo "gpu_day.sh: missing in $WHEELS: $missing; run 'bash benchmarks/gpu_day.sh fetch' where pip works" >&2
        exit 2
    }
    site=$(mktemp -d)
    trap 'rm -rf "$site"' EXIT
    # pure-Python wheels (py3-none-any): unpacked as they are, no pip needed (nor its settings)
    for wheel in "$WHEELS"/*.whl; do
        "$PYTHON" -m zipfile -e "$wheel" "$site"
    done
    export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
    "$PYTHON" -c "import tensordict, dash_fn; print('tensordict', tensordict.__version__, 'from', tensordict.__file__)"
    set +e
    "$PYTHON" -m benchmarks.gpu_check "${budget[@]}" --out "$out/gpu_check.md" "$@" 2>&1 | tee "$out/gpu_check.log"
    exit "${PIPESTATUS[0]}"
    ;;
*)
    sed -n '2,17p' "$0" >&2
    exit 2
    ;;
esac
