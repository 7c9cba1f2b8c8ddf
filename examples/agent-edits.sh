#!/usr/bin/env bash
# An agent-style client of Quire's JSON edit API (docs/api.md, "Editing with JSON"): it makes
# a branch of a document and proposes its edits there, for a person to review and merge (or
# reject) change by change; the document itself is not touched. Bash and curl only.
#
#   QUIRE_TOKEN=... examples/agent-edits.sh DOCUMENT [EDITS_FILE]
#
# EDITS_FILE holds one edit per line, each a request body of POST /edits
# (`{"ops": [...], "if_contains"?: [...]}`); without it, a small demonstration set is used.
# Settings (environment):
#   QUIRE_URL     the server (default http://127.0.0.1:1234)
#   QUIRE_TOKEN   a token with read on DOCUMENT and write on the branch's name (none in open mode)
#   AGENT_BRANCH  the branch's name (default DOCUMENT-agent-TIMESTAMP); "none" edits DOCUMENT
#                 itself, for a server without branches
#   AGENT_RUN     a name for this run (default: the time and the process id). Every request
#                 carries an Idempotency-Key made from it, so running the script again with the
#                 same AGENT_RUN after a failure applies each edit once.
#
# Each edit is sent once with its own key: 200 is applied; 409 (a precondition no longer
# holds, e.g. the text to replace is gone) is reported and skipped; 503 (busy) is retried
# with the same key; anything else stops the script.
set -euo pipefail

url=${QUIRE_URL:-http://127.0.0.1:1234}
doc=${1:?usage: agent-edits.sh DOCUMENT [EDITS_FILE]}
edits_file=${2:-}
run=${AGENT_RUN:-$(date +%Y%m%d-%H%M%S)-$$}
branch=${AGENT_BRANCH:-$doc-agent-$run}

# A document name as one path segment (every byte but letters and digits percent-encoded).
enc() {
    local LC_ALL=C s=$1 out= c i
    for ((i = 0; i < ${#s}; i++)); do
        c=${s:i:1}
        case $c in
        [a-zA-Z0-9]) out+=$c ;;
        *) out+=$(printf '%%%02X' "'$c") ;;
        esac
    done
    printf '%s' "$out"
}

# A string as a JSON string (backslashes and quotes escaped; names have no control characters).
json_str() {
    local s=${1//\\/\\\\}
    printf '"%s"' "${s//\"/\\\"}"
}

# api METHOD PATH [BODY [IDEMPOTENCY-KEY]]: sets $status and $body.
api() {
    local args=(-sS -X "$1" -w '\n%{http_code}' -H 'Content-Type: application/json')
    [[ -n ${QUIRE_TOKEN:-} ]] && args+=(-H "Authorization: Bearer $QUIRE_TOKEN")
    [[ -n ${4:-} ]] && args+=(-H "Idempotency-Key: $4")
    [[ -n ${3:-} ]] && args+=(--data-binary "$3")
    local out
    out=$(curl "${args[@]}" "$url/api/v1$2")
    status=${out##*$'\n'}
    body=${out%$'\n'*}
}

# 1. The branch: a document of its own, starting from DOCUMENT's content now.
target=$doc
if [[ $branch != none ]]; then
    api POST "/docs/$(enc "$doc")/branches" \
        "{\"name\": $(json_str "$branch"), \"title\": \"Proposed by an agent\"}" "$run-branch"
    case $status in
    201) echo "branch $branch made from $doc" ;;
    409) echo "branch $branch exists already: proposing there" ;;
    *) echo "cannot make the branch ($status): $body" >&2; exit 1 ;;
    esac
    target=$branch
fi
path="/docs/$(enc "$target")"

# 2. What the agent reads before deciding (a real agent would give this to its model).
api GET "$path/json"
[[ $status == 200 ]] || { echo "cannot read $target ($status): $body" >&2; exit 1; }
echo "content of $target: $body"

# 3. The proposals, one edit each (one reviewable change each in the branch's history).
if [[ -n $edits_file ]]; then
    mapfile -t proposals < <(grep -v '^[[:space:]]*$' "$edits_file")
else
    proposals=(
        '{"ops": [{"map": "meta", "set": "status", "value": "proposed"}]}'
        '{"ops": [{"text": "content", "replace": "teh", "with": "the", "all": true}], "if_contains": [{"text": "content", "value": "teh"}]}'
        '{"ops": [{"text": "content", "insert": "\n\nSummary (proposed): the figures above are from the March report."}]}'
    )
fi
applied=0 skipped=0 n=0
for edit in "${proposals[@]}"; do
    n=$((n + 1))
    for try in 1 2 3 4 5; do
        api POST "$path/edits" "$edit" "$run-edit-$n"
        [[ $status == 503 ]] || break
        sleep "$try"
    done
    case $status in
    200) applied=$((applied + 1)); echo "edit $n applied: $body" ;;
    409) skipped=$((skipped + 1)); echo "edit $n skipped, its precondition no longer holds: $body" ;;
    *) echo "edit $n refused ($status): $body" >&2; exit 1 ;;
    esac
done
echo "$applied edit(s) proposed, $skipped skipped, on $target"

# 4. For the reviewer.
if [[ $branch != none ]]; then
    cat <<REVIEW
Review the proposals (each change with its author and its diff against $doc):
  curl -H "Authorization: Bearer \$TOKEN" $url/api/v1$path/changes
Merge all of them into $doc (or some: {"changes": [ids]}), or close the branch:
  curl -X POST -H "Authorization: Bearer \$TOKEN" -H 'Content-Type: application/json' -d '{}' $url/api/v1$path/merge
  curl -X POST -H "Authorization: Bearer \$TOKEN" $url/api/v1$path/close
REVIEW
fi
