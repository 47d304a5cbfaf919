#!/bin/sh
# libacl_rt.so exports exactly the functions of CANN's headers (acl*) and cora's extension
# (cora_acl_*), and defines every function the headers declare but aclmdlRI* (model run
# instances, acl_graph.cpp). Usage: acl_exports.sh <libacl_rt.so> <include/acl>
set -eu
lib=$1
inc=$2
exported=$(nm -D --defined-only "$lib" | awk '{print $3}' | sort)
stray=$(printf '%s\n' "$exported" | grep -v -e '^acl' -e '^cora_acl_' || true)
if [ -n "$stray" ]; then
  echo "libacl_rt.so exports symbols outside the C API:"; printf '%s\n' "$stray" | head -20; exit 1
fi
declared=$(cat "$inc"/*.h | tr '\n' ' ' |
  grep -o 'ACL_FUNC_VISIBILITY [^;#(]*[^A-Za-z0-9_]acl[A-Za-z0-9_]*[[:space:]]*(' |
  sed -E 's/.*[^A-Za-z0-9_](acl[A-Za-z0-9_]*)[[:space:]]*\($/\1/' | grep -v '^aclmdlRI' | sort -u)
missing=$(printf '%s\n' "$declared" | while read -r f; do
  printf '%s\n' "$exported" | grep -qx "$f" || echo "$f"; done)
if [ -n "$missing" ]; then
  echo "declared in include/acl but not defined by libacl_rt.so:"; printf '%s\n' "$missing"; exit 1
fi
echo "libacl_rt.so: $(printf '%s\n' "$exported" | wc -l) exported functions, every declared one defined"
