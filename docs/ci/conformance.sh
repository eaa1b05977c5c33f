#!/usr/bin/env bash
# Certify a PyTorch PrivateUse1 backend with the privateuse1-conformance kit,
# in any CI system (GitLab CI, Jenkins, Buildkite, Azure Pipelines, GitHub
# Actions, a shell). Documented in docs/ci.md.
#
#   BACKEND=torch_xyz LEVEL=standard ./conformance.sh [RUN OPTIONS] [-- PYTEST ARGS]
#
# It installs the kit (and your backend, if asked), runs the suite, always
# leaves the report folder behind, appends report.md to the GitHub job summary
# when there is one, and gates on `privateuse1-conformance verify`: the script
# exits 0 only when the report proves the claimed level.
#
# Configuration (environment variables):
#   BACKEND          required: the module or registered profile name given to --backend
#   KIT              pip arguments that install the kit (default: privateuse1-conformance;
#                    pin it, e.g. privateuse1-conformance==0.1.0, or give a path or
#                    git+https URL); empty: the kit is already installed
#   BACKEND_PACKAGE  pip arguments that install your backend (a wheel, a path, a
#                    requirement, with pip options such as --extra-index-url);
#                    empty (default): it is already installed
#   MANIFEST         your manifest TOML (optional)
#   EXPECTATIONS     your expectations (known failures) TOML (optional)
#   LEVEL            the level you claim: core, standard or full (default: the
#                    level your manifest claims)
#   REPORT_DIR       where the reports go (default: conformance-report)
#   PYTHON           the interpreter to install into and run with (default: python3)
# KIT and BACKEND_PACKAGE are split into words at spaces (no globbing).
#
# Arguments are passed to `privateuse1-conformance run` after the options
# above: e.g. `-j 2`, `--timeout 120`, `--allow-untested-torch`, `-- -x`.
# Restricting the run (--contract, --test, -- -k ...) makes a narrowed run: its
# report records what narrowed it and reaches no level, and verify refuses it
# for any level: use that to try the script out, not to certify.
#
# Exit status:
#   0  verify: the report is consistent and complete for the claimed level
#   1  verify: it does not (the problems are listed above the exit)
#   2  a configuration error (BACKEND unset, a file that does not exist)
#   N  the run ended without writing report.json (N: its exit status, never 0),
#      or a pip install failed (pip's status)

set -euo pipefail

say() { printf 'conformance.sh: %s\n' "$*"; }

fail() {
    # $1: exit status; the rest: the message
    local status=$1
    shift
    printf 'conformance.sh: error: %s\n' "$*" >&2
    if [[ ${GITHUB_ACTIONS:-} == true ]]; then
        printf '::error title=PrivateUse1 conformance::%s\n' "$*"
    fi
    exit "$status"
}

BACKEND=${BACKEND:-}
KIT=${KIT-privateuse1-conformance}
BACKEND_PACKAGE=${BACKEND_PACKAGE:-}
MANIFEST=${MANIFEST:-}
EXPECTATIONS=${EXPECTATIONS:-}
LEVEL=${LEVEL:-}
REPORT_DIR=${REPORT_DIR:-conformance-report}
PYTHON=${PYTHON:-python3}

[[ -n $BACKEND ]] || fail 2 "set BACKEND to your backend's module or registered profile name (what --backend takes)"
if [[ -n $MANIFEST && ! -f $MANIFEST ]]; then
    fail 2 "MANIFEST=$MANIFEST: no such file"
fi
if [[ -n $EXPECTATIONS && ! -f $EXPECTATIONS ]]; then
    fail 2 "EXPECTATIONS=$EXPECTATIONS: no such file"
fi
command -v "$PYTHON" >/dev/null 2>&1 || fail 2 "PYTHON=$PYTHON: no such interpreter"

# 1. Install the backend, then the kit (which never replaces a torch inside
#    the range it supports).
pip_install() {
    # $1: what is installed (for the log); $2: pip arguments, split at spaces
    local what=$1 words
    read -r -a words <<<"$2"
    say "installing $what: $PYTHON -m pip install ${words[*]}"
    "$PYTHON" -m pip install "${words[@]}" || fail "$?" "pip could not install $what (${words[*]})"
}
if [[ -n $BACKEND_PACKAGE ]]; then
    pip_install "the backend" "$BACKEND_PACKAGE"
else
    say "BACKEND_PACKAGE is empty: using the backend already installed"
fi
if [[ -n $KIT ]]; then
    pip_install "the kit" "$KIT"
else
    say "KIT is empty: using the kit already installed"
fi

# The kit's command, from the interpreter's own scripts folder (the one pip
# installed into), else from PATH.
CLI=$("$PYTHON" - <<'EOF'
import os, site, sysconfig
schemes = [sysconfig.get_default_scheme()] + ([f"{os.name}_user"] if site.ENABLE_USER_SITE else [])
for scheme in schemes:
    try:
        path = os.path.join(sysconfig.get_path("scripts", scheme), "privateuse1-conformance")
    except KeyError:
        continue
    if os.access(path, os.X_OK):
        print(path)
        break
EOF
) || true
if [[ -z $CLI ]]; then
    CLI=$(command -v privateuse1-conformance) ||
        fail 2 "privateuse1-conformance is not installed for $PYTHON nor on PATH (set KIT, or PYTHON to the interpreter that has it)"
fi
say "kit: $("$CLI" --version)"

# 2. Run the suite. Its exit status is recorded, not acted on: the report is
#    written whatever happens, and verify decides.
run_args=(run --backend "$BACKEND" --report-dir "$REPORT_DIR")
if [[ -n $LEVEL ]]; then run_args+=(--level "$LEVEL"); fi
if [[ -n $MANIFEST ]]; then run_args+=(--manifest "$MANIFEST"); fi
if [[ -n $EXPECTATIONS ]]; then run_args+=(--expectations "$EXPECTATIONS"); fi
run_args+=("$@")

report=$REPORT_DIR/report.json
# Never verify a report left by an earlier run.
rm -f "$report"
say "running: $CLI ${run_args[*]}"
run_status=0
"$CLI" "${run_args[@]}" || run_status=$?
say "the run exited with status $run_status (0: every test passed; 1: some did not; 2: interrupted or a bad option; 3: internal error; 4: usage error; 5: no test selected)"

if [[ ! -f $report ]]; then
    [[ $run_status -ne 0 ]] || run_status=1
    fail "$run_status" "the run wrote no report ($report does not exist): it stopped before the suite started; see its output above (exit status $run_status)"
fi

# A run that was killed or interrupted leaves report.json but not the
# renderings, which are written at its end: write them from report.json.
if [[ ! -f $REPORT_DIR/report.md ]]; then
    say "the run left no renderings: writing them from $report"
    "$CLI" render "$report" || say "warning: could not render $report (see above)"
fi

# 3. Publish: the GitHub job summary, when there is one. (Every CI: keep the
#    whole $REPORT_DIR as an artifact, report.junit.xml for the test reporter.)
if [[ -n ${GITHUB_STEP_SUMMARY:-} ]]; then
    if [[ -f $REPORT_DIR/report.md ]]; then
        cat "$REPORT_DIR/report.md" >>"$GITHUB_STEP_SUMMARY"
        say "appended $REPORT_DIR/report.md to the job summary"
    else
        say "warning: no $REPORT_DIR/report.md to append to the job summary"
    fi
fi

# 4. Gate: verify the report for the claimed level.
verify_args=(verify "$report")
if [[ -n $LEVEL ]]; then verify_args+=(--level "$LEVEL"); fi
say "verifying: $CLI ${verify_args[*]}"
verify_status=0
"$CLI" "${verify_args[@]}" || verify_status=$?
if [[ -n $LEVEL ]]; then
    claim="level $LEVEL"
else
    claim="the level the manifest claims (or, without a claim, the level reached)"
fi
if [[ $verify_status -eq 0 ]]; then
    say "verified: the report proves $claim (report folder: $REPORT_DIR)"
else
    fail "$verify_status" "not verified (verify exited with status $verify_status): the report does not prove $claim; the problems are listed above, the report is in $REPORT_DIR"
fi
