#!/bin/sh
# packaging/gen_man.sh GWTF OUT — writes the man page gwtf.1 from the
# program's own help: `gwtf --help` for the synopsis and one section per
# command with the exact text of `gwtf help COMMAND`, so the page and the
# program can never disagree (test/ship checks that they do not).
set -eu
gwtf=$1
out=$2
tmp="$out.tmp"

# roff: a backslash is \e, a line starting with . or ' is protected by \&,
# - is \- so that options copied from the page are ASCII hyphens, and the
# em dash (the only non-ASCII character gwtf prints) is \(em.
roff() {
  sed -e 's/\\/\\e/g' -e 's/-/\\-/g' -e "s/^\\([.']\\)/\\\\\\&\\1/" -e 's/—/\\(em/g'
}

version=$("$gwtf" --version | sed -n '1s/^gwtf //p')
{
  printf '.TH GWTF 1 "" "gwtf %s" "User Commands"\n' "$version"
  printf '.SH NAME\ngwtf \\- train one language model together over a peer\\-to\\-peer swarm\n'
  printf '.SH SYNOPSIS\n.B gwtf\n.I command\n.RI [ options ]\n.br\n'
  printf '.B gwtf help\n.I command\n'
  printf '.SH DESCRIPTION\n'
  printf 'gwtf is a peer in a decentralized training swarm: every participant runs\n'
  printf 'the same program. The text below is what \\fBgwtf \\-\\-help\\fR and\n'
  printf '\\fBgwtf help\\fR \\fIcommand\\fR print.\n'
  printf '.PP\n.nf\n'
  "$gwtf" --help | roff
  printf '.fi\n.SH COMMANDS\n'
  "$gwtf" help --list | while IFS= read -r cmd; do
    printf '.SS "gwtf %s"\n.nf\n' "$cmd"
    # shellcheck disable=SC2086 # two-word commands are two arguments
    "$gwtf" help $cmd | roff
    printf '.fi\n'
  done
  printf '.SH FILES\n'
  printf '.TP\n.I ~/.gwtf\nidentity key (mode 0600) and checkpoints of a node run by hand (\\fB\\-\\-data\\-dir\\fR)\n'
  printf '.TP\n.I /etc/gwtf/node.conf\nrun, bootstrap peers and device of the gwtf\\-node service\n'
  printf '.TP\n.I /var/lib/gwtf\nidentity and checkpoints of the gwtf\\-node service\n'
  printf '.SH SEE ALSO\n.BR systemctl (1),\n.BR journalctl (1);\n'
  printf 'the README and docs/ in /usr/share/doc/gwtf\n'
} >"$tmp"
mv "$tmp" "$out"
