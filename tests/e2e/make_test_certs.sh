#!/usr/bin/env bash
# Writes a throwaway PKI for the TLS/mTLS end-to-end tests into DIR:
#   ca.pem            CA that signs server.pem and client.pem
#   server.{pem,key}  server certificate, SAN DNS:localhost and IP:127.0.0.1
#   client.{pem,key}  client certificate (extendedKeyUsage clientAuth)
#   other_ca.pem      an unrelated CA; other_client.{pem,key} and
#                     other_server.{pem,key} (a rotated-in server certificate,
#                     same names as server.pem) are signed by it
# EC P-256 keys keep it fast; everything is valid for one day.
set -euo pipefail
dir=$1
cd "$dir"
quiet() { "$@" >/dev/null 2>&1 || { echo "make_test_certs: failed: $*" >&2; exit 1; }; }

make_ca() {  # NAME
  quiet openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 \
    -subj "/CN=flashsampler test $1" -keyout "$1.key" -out "$1.pem" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign
}
make_leaf() {  # NAME CA EXTENSIONS
  quiet openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -subj "/CN=flashsampler test $1" -keyout "$1.key" -out "$1.csr"
  printf '%s\n' "$3" > "$1.ext"
  quiet openssl x509 -req -in "$1.csr" -CA "$2.pem" -CAkey "$2.key" -CAcreateserial \
    -days 1 -out "$1.pem" -extfile "$1.ext"
}

make_ca ca
make_ca other_ca
make_leaf server ca "subjectAltName=DNS:localhost,IP:127.0.0.1
extendedKeyUsage=serverAuth"
make_leaf client ca "extendedKeyUsage=clientAuth"
make_leaf other_client other_ca "extendedKeyUsage=clientAuth"
make_leaf other_server other_ca "subjectAltName=DNS:localhost,IP:127.0.0.1
extendedKeyUsage=serverAuth"
