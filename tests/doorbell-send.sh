#!/bin/sh
# Smoke test for scripts/doorbell-send. Needs jq. Runs under dash.
# usage: tests/doorbell-send.sh [path/to/doorbell-send]

export LC_ALL=C
here=$(cd "$(dirname "$0")/../scripts" && pwd)
S=${1:-$here/doorbell-send}
command -v jq >/dev/null || { echo "jq is required" >&2; exit 1; }

T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT INT TERM
D=$T/bridge
mkdir "$D" && chmod 700 "$D"
: >"$D/web-inbox.jsonl"
: >"$D/design-inbox.jsonl"
INBOX=$D/web-inbox.jsonl
export DOORBELL_DIR="$D" DOORBELL_AGENT=design
unset XDG_DATA_HOME

pass=0 failures=0
ok() { pass=$((pass + 1)); }
fail() {
	failures=$((failures + 1))
	printf 'FAIL: %s\n' "$*" >&2
}
lines() { wc -l <"$1" | tr -d ' '; }

# check_last ID EXPECTED_FILE LABEL: the inbox's last line is valid JSON, has ID, and its
# text is byte-for-byte EXPECTED_FILE.
check_last() {
	tail -n 1 "$INBOX" >"$T/line"
	if ! jq -e 'type == "object"' "$T/line" >/dev/null 2>&1; then
		fail "$3: last line is not valid JSON"
		return
	fi
	got_id=$(jq -r .id "$T/line")
	[ "$got_id" = "$1" ] || { fail "$3: id printed '$1' but line has '$got_id'"; return; }
	jq -j '.message.parts[0].text' "$T/line" >"$T/got"
	if cmp -s "$T/got" "$2"; then ok; else fail "$3: text differs (cmp: $(cmp "$T/got" "$2" 2>&1 | head -c 200))"; fi
}

# send_arg FILE LABEL: send FILE's bytes as the TEXT argument; expect them back exactly.
send_arg() {
	t=$(cat "$1"; printf x)
	t=${t%x}
	n0=$(lines "$INBOX")
	id=$("$S" --to web -- "$t" 2>"$T/err")
	rc=$?
	[ $rc -eq 0 ] || { fail "$2 (arg): exit $rc: $(cat "$T/err")"; return; }
	[ "$(lines "$INBOX")" -eq $((n0 + 1)) ] || fail "$2 (arg): expected exactly one new line"
	check_last "$id" "$1" "$2 (arg)"
}

# send_stdin FILE LABEL: send FILE on stdin; expect it back minus all trailing newlines.
send_stdin() {
	t=$(cat "$1") # command substitution drops all trailing newlines
	printf '%s' "$t" >"$T/expect"
	n0=$(lines "$INBOX")
	id=$("$S" --to web <"$1" 2>"$T/err")
	rc=$?
	[ $rc -eq 0 ] || { fail "$2 (stdin): exit $rc: $(cat "$T/err")"; return; }
	[ "$(lines "$INBOX")" -eq $((n0 + 1)) ] || fail "$2 (stdin): expected exactly one new line"
	check_last "$id" "$T/expect" "$2 (stdin)"
}

both() { # both LABEL  (input in $T/in)
	send_arg "$T/in" "$1"
	send_stdin "$T/in" "$1"
}

# expect_refused CODE LABEL CMD...: CMD exits CODE and appends nothing.
expect_refused() {
	want=$1 label=$2
	shift 2
	n0=$(lines "$INBOX")
	"$@" >"$T/out" 2>"$T/err" </dev/null
	rc=$?
	if [ $rc -ne "$want" ]; then
		fail "$label: exit $rc, want $want (stderr: $(cat "$T/err"))"
	elif [ ! -s "$T/err" ]; then
		fail "$label: no message on stderr"
	elif [ -s "$T/out" ]; then
		fail "$label: printed something on stdout"
	elif [ "$(lines "$INBOX")" -ne "$n0" ]; then
		fail "$label: the inbox changed"
	else
		ok
	fi
}

refuse_stdin() { # refuse_stdin LABEL WORD (input in $T/in): refused with exit 2, WORD in the message
	n0=$(lines "$INBOX")
	"$S" --to web <"$T/in" >"$T/out" 2>"$T/err"
	rc=$?
	if [ $rc -eq 2 ] && grep -q "$2" "$T/err" && [ ! -s "$T/out" ] && [ "$(lines "$INBOX")" -eq "$n0" ]; then ok; else fail "$1 (stdin): exit $rc, stderr: $(cat "$T/err")"; fi
}
refuse_arg() {
	t=$(cat "$T/in"; printf x)
	t=${t%x}
	expect_refused 2 "$1 (arg)" "$S" --to web -- "$t"
}

echo "== nasty texts"
i=1
while [ $i -le 31 ]; do
	printf "a$(printf '\\%03o' $i)b" >"$T/in"
	both "control byte $i"
	i=$((i + 1))
done
printf '\001\002\003\004\005\006\007\010\011\012\013\014\015\016\017\020\021\022\023\024\025\026\027\030\031\032\033\034\035\036\037\177' >"$T/in"
both "all control bytes and DEL together"
printf '\177' >"$T/in"; both "DEL alone"
printf '"quoted" \\back\\slash\\ \\\\ \\" "\\' >"$T/in"; both "quotes and backslashes"
printf '%s' '$(rm -rf /) `rm -rf /` ${HOME} $HOME ; | & > < * ? [a] ~' >"$T/in"; both "shell syntax"
printf '%s' '%s%n%d %% %b %c %q \n \t \0 \x41 \\n' >"$T/in"; both "printf syntax and literal backslash-n"
printf '%s' '-e' >"$T/in"; both "-e"
printf '%s' '-n' >"$T/in"; both "-n"
printf '%s' '--to' >"$T/in"; both "--to as text"
printf '%s' '- leading dash' >"$T/in"; both "leading dash"
printf '%s' 'é 日本 🚀 ü ñ Ω € 𝄞' >"$T/in"; both "non-ASCII"
printf '\357\273\277BOM at start, U+2028 \342\200\250 U+FFFF \357\277\277 U+10FFFF \364\217\277\277' >"$T/in"; both "BOM, U+2028, U+FFFF, U+10FFFF"
awk 'BEGIN { for (c = 128; c < 2048; c++) printf "%c%c", 192 + int(c / 64), 128 + c % 64 }' >"$T/in"; both "every 2-byte code point"
awk 'BEGIN { for (c = 2048; c < 65536; c += 61) { if (c >= 55296 && c < 57344) continue; printf "%c%c%c", 224 + int(c / 4096), 128 + int(c / 64) % 64, 128 + c % 64 } }' >"$T/in"; both "3-byte code points"
: >"$T/in"; both "empty"
printf 'trailing newlines\n\n\n' >"$T/in"; both "trailing newlines (kept as arg, dropped on stdin)"
printf '\n\n\n' >"$T/in"; both "only newlines"
printf '\n\nlead\n\nmid\r\n\r\n' >"$T/in"; both "leading, middle and CRLF newlines"
printf 'no newline at end' >"$T/in"; both "no newline at end"

# 64 KiB: a chunk of every kind of nasty byte, repeated, padded to exactly 65536 bytes.
printf 'tab\there "q" \\b nl\nCR\r ctl \001\037\177 é 日本 🚀 $(x) %%s `y` -e\n' >"$T/chunk"
: >"$T/in"
csize=$(wc -c <"$T/chunk")
n=0
while [ $(((n + 1) * csize)) -le 65536 ]; do cat "$T/chunk" >>"$T/in"; n=$((n + 1)); done
head -c $((65536 - n * csize)) /dev/zero | tr '\0' 'z' >>"$T/in"
[ "$(wc -c <"$T/in")" -eq 65536 ] || fail "64 KiB fixture is not 65536 bytes"
both "64 KiB nasty text"
head -c 65536 /dev/zero | tr '\0' '"' >"$T/in"; both "64 KiB of quotes"

echo "== exact line shape"
"$S" --to web --id fixed.1 -- "$(printf 'a\001\010\011\012\014\015\037\177"\\z')" >/dev/null
tail -n 1 "$INBOX" | sed 's/"createdAt":"[^"]*"/"createdAt":"T"/' >"$T/got"
printf '%s\n' '{"id":"fixed.1","from":"design","to":"web","kind":"note","createdAt":"T","message":{"role":"agent","parts":[{"type":"text","text":"a\u0001\b\t\n\f\r\u001f\u007f\"\\z"}]}}' >"$T/want"
if cmp -s "$T/got" "$T/want"; then ok; else fail "exact note line: $(cat "$T/got")"; fi

id=$("$S" --to web --from web --kind request --task-id q-20260902-026 --priority 1 --reply-by 2026-09-03T09:00:00Z --context-id ctx.9 "REQUEST: x")
tail -n 1 "$INBOX" | sed 's/"createdAt":"[^"]*"/"createdAt":"T"/' >"$T/got"
printf '%s\n' "{\"id\":\"$id\",\"from\":\"web\",\"to\":\"web\",\"kind\":\"request\",\"contextId\":\"ctx.9\",\"taskId\":\"q-20260902-026\",\"state\":\"submitted\",\"createdAt\":\"T\",\"priority\":1,\"replyBy\":\"2026-09-03T09:00:00Z\",\"message\":{\"role\":\"agent\",\"parts\":[{\"type\":\"text\",\"text\":\"REQUEST: x\"}]}}" >"$T/want"
if cmp -s "$T/got" "$T/want"; then ok; else fail "exact request line: $(cat "$T/got")"; fi

# a task id is carried as any text of 1-256 bytes, escaped like the message text
"$S" --to web --task-id 'fix bug #12' hi >/dev/null &&
	[ "$(tail -n 1 "$INBOX" | jq -r .taskId)" = 'fix bug #12' ] && ok || fail "a task id with spaces and #"
"$S" --to web --task-id 'say "é" \ now' hi >/dev/null &&
	[ "$(tail -n 1 "$INBOX" | jq -r .taskId)" = 'say "é" \ now' ] && ok || fail "a task id with a quote, a backslash and UTF-8"
long=$(printf '%0257d' 0)
rc=0; "$S" --to web --task-id "$long" hi >/dev/null 2>"$T/err" || rc=$?
[ $rc -eq 2 ] && grep -q '1-256 bytes' "$T/err" && ok || fail "a task id of 257 bytes: rc $rc $(cat "$T/err")"

# key order of each kind
keys() { tail -n 1 "$INBOX" | jq -c '[keys_unsorted[]]'; }
id=$("$S" --to web --kind request hi)
[ "$(keys)" = '["id","from","to","kind","contextId","state","createdAt","message"]' ] && ok || fail "request keys: $(keys)"
[ "$(tail -n 1 "$INBOX" | jq -r .contextId)" = "$id" ] && ok || fail "request contextId defaults to its id"
"$S" --to web --correlates-to "$id" --state completed --task-id t1 --priority 3 --reply-by 90s done >/dev/null
[ "$(keys)" = '["id","from","to","kind","correlatesTo","taskId","state","createdAt","priority","replyBy","message"]' ] && ok || fail "response keys: $(keys)"
[ "$(tail -n 1 "$INBOX" | jq -r .kind)" = response ] && ok || fail "--correlates-to makes kind response"
"$S" --to web --correlates-to "$id" --context-id "$id" fyi --kind note >/dev/null
[ "$(keys)" = '["id","from","to","kind","correlatesTo","contextId","createdAt","message"]' ] && ok || fail "note keys: $(keys)"
"$S" --to=web --from=web --kind=request --priority=0 --id=eq.form --state=submitted "x" >/dev/null &&
	[ "$(tail -n 1 "$INBOX" | jq -c '[.id,.from,.kind,.priority,.state]')" = '["eq.form","web","request",0,"submitted"]' ] && ok || fail "--flag=value forms"

for d in 90s 30m 2h 2d 0s 007m; do
	"$S" --to web --reply-by "$d" x >/dev/null
	case $d in *s) m=1 ;; *m) m=60 ;; *h) m=3600 ;; *d) m=86400 ;; esac
	n=${d%?}
	n=${n#"${n%%[!0]*}"}
	want=$(tail -n 1 "$INBOX" | jq -r --argjson s $((${n:-0} * m)) '(.createdAt | sub("\\.[0-9]+Z$"; "Z") | fromdateiso8601) + $s | todateiso8601')
	got=$(tail -n 1 "$INBOX" | jq -r .replyBy)
	[ "$got" = "$want" ] && ok || fail "--reply-by $d: got $got want $want"
done
for t in 2026-11-29T23:06:00Z 2026-11-29T23:06:00.123+01:00 2026-11-29t23:06:00-05:30; do
	"$S" --to web --reply-by "$t" x >/dev/null
	[ "$(tail -n 1 "$INBOX" | jq -r .replyBy)" = "$t" ] && ok || fail "--reply-by $t passed through"
done
n64=aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa
id128=$n64$n64
: >"$D/$n64-inbox.jsonl"
: >"$D/0.a_b-c-inbox.jsonl"
"$S" --to "$n64" --from 0.a_b-c --id "$id128" x >/dev/null && ok || fail "64-char name and 128-char id accepted"
rm "$D/0.a_b-c-inbox.jsonl"
printf 'from dash stdin\n' | "$S" --to web - >/dev/null && [ "$(tail -n 1 "$INBOX" | jq -r '.message.parts[0].text')" = "from dash stdin" ] && ok || fail "'-' reads stdin"
"$S" --help | grep -q 'usage: doorbell-send' && ok || fail "--help"

echo "== refused input"
printf 'a\000b' >"$T/in"; refuse_stdin "NUL in the middle" NUL
printf '\000' >"$T/in"; refuse_stdin "NUL alone" NUL
printf 'abc\000\n\n' >"$T/in"; refuse_stdin "NUL before trailing newlines" NUL
for bad in '\200' 'a\303' '\303a' '\300\200' '\340\200\200' '\360\200\200\200' '\355\240\200' '\364\220\200\200' '\365\200\200\200' '\370\210\200\200\200' '\376' '\377' 'ok \342\202 then more text\n'; do
	printf "$bad" >"$T/in"
	refuse_stdin "invalid UTF-8 $bad" UTF-8
	refuse_arg "invalid UTF-8 $bad"
done
# invalid byte after 64 KiB of good text
{ head -c 65536 /dev/zero | tr '\0' 'a'; printf '\377tail'; } >"$T/in"
refuse_stdin "invalid UTF-8 after 64 KiB" UTF-8
refuse_arg "invalid UTF-8 after 64 KiB"

expect_refused 2 "unknown kind" "$S" --to web --kind ask x
expect_refused 2 "unknown state" "$S" --to web --correlates-to r1 --state done x
expect_refused 2 "priority 4" "$S" --to web --priority 4 x
expect_refused 2 "priority 01" "$S" --to web --priority 01 x
expect_refused 2 "response without --correlates-to" "$S" --to web --kind response --state completed x
expect_refused 2 "response without --state" "$S" --to web --correlates-to r1 x
expect_refused 2 "response with state submitted" "$S" --to web --correlates-to r1 --state submitted x
expect_refused 2 "note with --state" "$S" --to web --kind note --state working x
expect_refused 2 "request with --correlates-to" "$S" --to web --kind request --correlates-to r1 x
expect_refused 2 "unknown sender" "$S" --to web --from ghost x
expect_refused 2 "request with state working" "$S" --to web --kind request --state working x
expect_refused 2 "reserved id with ':'" "$S" --to web --id debt:1 x
expect_refused 2 "id of 129 chars" "$S" --to web --id "${id128}a" x
expect_refused 2 "empty id" "$S" --to web --id "" x
expect_refused 2 "id with a space" "$S" --to web --id "a b" x
expect_refused 2 "bad --correlates-to" "$S" --to web --correlates-to 'r"1' --state completed x
expect_refused 2 "bad --context-id" "$S" --to web --context-id 'c/1' x
for loop in bridge debt-loop report-loop; do
	expect_refused 2 "--from $loop" "$S" --to web --from "$loop" x
done
for name in Web .web -web 'we b' 'a/b' '../x' "${n64}a" ''; do
	expect_refused 2 "bad --to '$name'" "$S" --to "$name" x
	expect_refused 2 "bad --from '$name'" "$S" --to web --from "$name" x
done
expect_refused 2 "bad DOORBELL_AGENT" env DOORBELL_AGENT=Bad "$S" --to web x
expect_refused 2 "no --to" "$S" x
expect_refused 2 "no sender" env -u DOORBELL_AGENT "$S" --to web x
expect_refused 2 "--to twice" "$S" --to web --to design x
expect_refused 2 "unknown option" "$S" --to web --urgent x
expect_refused 2 "text starting with - without --" "$S" --to web -e
expect_refused 2 "two texts" "$S" --to web one two
expect_refused 2 "--to without value" "$S" --to
expect_refused 2 "bad --reply-by" "$S" --to web --reply-by tomorrow x
expect_refused 2 "bad --reply-by unit" "$S" --to web --reply-by 3y x
expect_refused 2 "bad --reply-by time" "$S" --to web --reply-by '2026-11-29T23:06:00' x
expect_refused 2 "missing bridge folder" "$S" --dir "$T/nope" --to web x
[ ! -e "$T/nope" ] && ok || fail "missing bridge folder was created"

echo "== unknown agent, symlink, FIFO"
ls -a "$D" >"$T/before"
expect_refused 2 "unknown agent" "$S" --to wbe x
[ "$(cat "$T/err")" = "doorbell-send: no such agent 'wbe' (known: $n64, design, web; add one with 'doorbell agent add')" ] && ok || fail "unknown agent message: $(cat "$T/err")"
ls -a "$D" >"$T/after"
cmp -s "$T/before" "$T/after" && ok || fail "unknown agent created a file"
mkdir "$T/empty"
"$S" --dir "$T/empty" --to web x 2>"$T/err"
rc=$?
[ $rc -eq 2 ] && [ "$(cat "$T/err")" = "doorbell-send: no such agent 'web' (no agents yet; add one with 'doorbell agent add')" ] && [ -z "$(ls -A "$T/empty")" ] && ok || fail "no agents yet: rc $rc $(cat "$T/err")"
ln -s web-inbox.jsonl "$D/evil-inbox.jsonl"
expect_refused 2 "symlinked inbox" "$S" --to evil x
ln -s /nonexistent "$D/dangling-inbox.jsonl"
expect_refused 2 "dangling symlinked inbox" "$S" --to dangling x
[ ! -e /nonexistent ] && ok || fail "dangling symlink was followed"
mkfifo "$D/pipe-inbox.jsonl"
expect_refused 2 "FIFO inbox" timeout 5 "$S" --to pipe x
mkdir "$D/dir-inbox.jsonl"
expect_refused 2 "folder as inbox" "$S" --to dir x
rm -f "$D/evil-inbox.jsonl" "$D/dangling-inbox.jsonl" "$D/pipe-inbox.jsonl"
rmdir "$D/dir-inbox.jsonl"

echo "== torn-tail repair"
printf '{"partial' >>"$INBOX"
n0=$(lines "$INBOX")
id=$("$S" --to web after-crash)
[ "$(tail -n 2 "$INBOX" | head -n 1)" = '{"partial' ] && ok || fail "fragment is not alone on its line"
tail -n 1 "$INBOX" | jq -e --arg id "$id" '.id == $id and .message.parts[0].text == "after-crash"' >/dev/null && ok || fail "message after fragment is not a valid line"
[ "$(lines "$INBOX")" -eq $((n0 + 2)) ] && ok || fail "torn tail: expected fragment newline + one line"
id2=$("$S" --to web next)
[ "$(lines "$INBOX")" -eq $((n0 + 3)) ] && ok || fail "no extra newline once repaired"
printf 'nul fragment\000' >>"$INBOX"
"$S" --to web after-nul >/dev/null
tail -n 1 "$INBOX" | jq -e '.message.parts[0].text == "after-nul"' >/dev/null && ok || fail "fragment ending in NUL not repaired"
tail -c 1 "$INBOX" | od -An -c | grep -q '\\n' && ok || fail "inbox does not end in a newline"

echo "== 16 concurrent senders x 100"
C=$T/conc
mkdir "$C"
: >"$C/sink-inbox.jsonl"
k=1
while [ $k -le 16 ]; do
	: >"$C/s$k-inbox.jsonl" # a sender is a station
	k=$((k + 1))
done
k=1
while [ $k -le 16 ]; do
	(
		j=1
		while [ $j -le 100 ]; do
			"$S" --dir "$C" --to sink --from "s$k" "sender $k	msg $j
line two \"q\"" >/dev/null || echo "send failed $k $j" >&2
			j=$((j + 1))
		done
	) &
	k=$((k + 1))
done
wait
[ "$(lines "$C/sink-inbox.jsonl")" -eq 1600 ] && ok || fail "concurrent: $(lines "$C/sink-inbox.jsonl") lines, want 1600"
jq -e . "$C/sink-inbox.jsonl" >/dev/null 2>&1 && ok || fail "concurrent: some line is not valid JSON"
[ "$(jq -r .id "$C/sink-inbox.jsonl" | sort -u | wc -l)" -eq 1600 ] && ok || fail "concurrent: ids not unique"
[ "$(jq -r .id "$C/sink-inbox.jsonl" | grep -c '^[0-9A-HJKMNP-TV-Z]\{26\}$')" -eq 1600 ] && ok || fail "concurrent: ids are not ULIDs"
[ "$(jq -r '.message.parts[0].text | split("\n")[0]' "$C/sink-inbox.jsonl" | sort -u | wc -l)" -eq 1600 ] && ok || fail "concurrent: texts not all distinct"
# per sender, ids sort in sending order (different milliseconds) or tie on the time part
bad_order=$(jq -r '[.from, .id] | @tsv' "$C/sink-inbox.jsonl" | awk -F '\t' '{ t = substr($2, 1, 10); if (($1 in last) && t < last[$1]) n++; last[$1] = t } END { print n + 0 }')
[ "$bad_order" -eq 0 ] && ok || fail "concurrent: $bad_order ids went back in time per sender"

echo "passed: $pass, failed: $failures"
[ $failures -eq 0 ]
