#!/usr/bin/env bash
# Regenerates the OpenSSL-made certificate fixtures in this folder (see README.md).
#
# Run from anywhere: `bash crates/route-secrets/src/testing/certs/generate.sh`. Keys and
# certificates are only made when their file is missing (FORCE=1 re-issues every
# certificate, keeping the keys). Needs OpenSSL 3 (the CLI, not HAProxy's library).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
keys="$here/../keys"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"

# Every fixture is valid from 2020-01-01 to 2120-01-01 unless it says otherwise, so
# that tests may use any "now" in between.
start=20200101000000Z
end=21200101000000Z

key() { # file genpkey-arguments...
  local file="$keys/$1"; shift
  [ -f "$file" ] || openssl genpkey "$@" -quiet -out "$file"
}
key ca-rsa-root.pkcs8.pem -algorithm RSA -pkeyopt rsa_keygen_bits:2048
key ca-rsa-intermediate.pkcs8.pem -algorithm RSA -pkeyopt rsa_keygen_bits:2048
key ca-ec-root.pkcs8.pem -algorithm EC -pkeyopt ec_paramgen_curve:P-256
key rsa-3072.pkcs8.pem -algorithm RSA -pkeyopt rsa_keygen_bits:3072
key rsa-4096.pkcs8.pem -algorithm RSA -pkeyopt rsa_keygen_bits:4096
key rsa-2048-e3.pkcs8.pem -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -pkeyopt rsa_keygen_pubexp:3
key ec-p224.pkcs8.pem -algorithm EC -pkeyopt ec_paramgen_curve:P-224
key ec-secp256k1.pkcs8.pem -algorithm EC -pkeyopt ec_paramgen_curve:secp256k1
key ec-brainpoolp256r1.pkcs8.pem -algorithm EC -pkeyopt ec_paramgen_curve:brainpoolP256r1
key ed25519.pkcs8.pem -algorithm ED25519
key rsa-pss-2048.pkcs8.pem -algorithm RSA-PSS -pkeyopt rsa_keygen_bits:2048
if [ ! -f "$keys/dsa-2048.pkcs8.pem" ]; then
  openssl genpkey -genparam -algorithm DSA -pkeyopt dsa_paramgen_bits:2048 -out dsa.params
  openssl genpkey -paramfile dsa.params -out "$keys/dsa-2048.pkcs8.pem"
fi

cat > openssl.cnf <<CNF
[ca]
default_ca = fixtures
[fixtures]
database = index.txt
new_certs_dir = .
serial = serial
policy = anything
unique_subject = no
copy_extensions = none
[anything]
commonName = supplied
organizationName = optional
[req]
distinguished_name = dn
[dn]
[ca_ext]
basicConstraints = critical,CA:true
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
[leaf_ext]
basicConstraints = CA:false
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = DNS:test.example.com
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
[self_ext]
basicConstraints = CA:false
subjectAltName = DNS:test.example.com
subjectKeyIdentifier = hash
CNF
: > index.txt
echo 1000 > serial

# issue OUT SUBJECT-CN KEY ISSUER-CERT|self ISSUER-KEY DIGEST EXTENSION-SECTION [SIGOPT...]
issue() {
  local out=$1 cn=$2 key=$3 issuer=$4 issuer_key=$5 digest=$6 ext=$7
  shift 7
  local sigopts=()
  for opt in "$@"; do sigopts+=(-sigopt "$opt"); done
  if [ -f "$here/$out" ] && [ "${FORCE:-0}" != 1 ]; then return; fi
  openssl req -new -config openssl.cnf -key "$keys/$key" -subj "/O=certwatch fixtures/CN=$cn" -out csr.pem
  if [ "$issuer" = self ]; then
    openssl ca -config openssl.cnf -batch -notext -rand_serial -selfsign -keyfile "$keys/$key" \
      -startdate $start -enddate $end -md "$digest" "${sigopts[@]}" -extensions "$ext" -in csr.pem -out "$here/$out" 2>/dev/null
  else
    openssl ca -config openssl.cnf -batch -notext -rand_serial -cert "$here/$issuer" -keyfile "$keys/$issuer_key" \
      -startdate $start -enddate $end -md "$digest" "${sigopts[@]}" -extensions "$ext" -in csr.pem -out "$here/$out" 2>/dev/null
  fi
}

# The CAs. The SHA-1 and MD5 variants of the intermediate share its name and key, so a
# leaf issued by the intermediate chains to any of them.
issue root.crt "fixture root CA" ca-rsa-root.pkcs8.pem self - sha256 ca_ext
issue root-sha1.crt "fixture root CA" ca-rsa-root.pkcs8.pem self - sha1 ca_ext
issue root-rsa-1024.crt "fixture 1024-bit root CA" rsa-1024.pkcs8.pem self - sha256 ca_ext
issue intermediate.crt "fixture intermediate CA" ca-rsa-intermediate.pkcs8.pem root.crt ca-rsa-root.pkcs8.pem sha256 ca_ext
issue intermediate-sha1.crt "fixture intermediate CA" ca-rsa-intermediate.pkcs8.pem root.crt ca-rsa-root.pkcs8.pem sha1 ca_ext
issue intermediate-md5.crt "fixture intermediate CA" ca-rsa-intermediate.pkcs8.pem root.crt ca-rsa-root.pkcs8.pem md5 ca_ext
issue intermediate-rsa-1024.crt "fixture 1024-bit intermediate CA" rsa-1024.pkcs8.pem root.crt ca-rsa-root.pkcs8.pem sha256 ca_ext
issue intermediate-under-rsa-1024-root.crt "fixture intermediate CA" ca-rsa-intermediate.pkcs8.pem root-rsa-1024.crt rsa-1024.pkcs8.pem sha256 ca_ext
issue ec-root.crt "fixture ECDSA root CA" ca-ec-root.pkcs8.pem self - sha256 ca_ext
issue dsa-root.crt "fixture DSA root CA" dsa-2048.pkcs8.pem self - sha256 ca_ext

# Leaves for test.example.com issued by the intermediate (SHA-256), one per key.
for key in rsa-2048-a rsa-1024 rsa-3072 rsa-4096 rsa-2048-e3 ec-p224 ec-p521 ec-secp256k1 \
  ec-brainpoolp256r1 ed25519 ed448 dsa-2048 rsa-pss-2048; do
  issue "leaf-$key.crt" test.example.com "$key.pkcs8.pem" intermediate.crt ca-rsa-intermediate.pkcs8.pem sha256 leaf_ext
done
# Leaves with weak signatures (key rsa-2048-a unless named).
issue leaf-sha1.crt test.example.com rsa-2048-a.pkcs8.pem intermediate.crt ca-rsa-intermediate.pkcs8.pem sha1 leaf_ext
issue leaf-md5.crt test.example.com rsa-2048-a.pkcs8.pem intermediate.crt ca-rsa-intermediate.pkcs8.pem md5 leaf_ext
issue leaf-ecdsa-sha1.crt test.example.com rsa-2048-a.pkcs8.pem ec-root.crt ca-ec-root.pkcs8.pem sha1 leaf_ext
issue leaf-dsa-sha1.crt test.example.com rsa-2048-a.pkcs8.pem dsa-root.crt dsa-2048.pkcs8.pem sha1 leaf_ext
issue leaf-under-dsa-root.crt test.example.com rsa-2048-a.pkcs8.pem dsa-root.crt dsa-2048.pkcs8.pem sha256 leaf_ext
issue leaf-under-rsa-1024.crt test.example.com rsa-2048-a.pkcs8.pem intermediate-rsa-1024.crt rsa-1024.pkcs8.pem sha256 leaf_ext
# RSASSA-PSS signatures: with SHA-256 (fine), and with SHA-1 (refused by HAProxy; Go
# cannot read it, so the router does not flag it).
issue leaf-pss-sha256.crt test.example.com rsa-2048-a.pkcs8.pem intermediate.crt ca-rsa-intermediate.pkcs8.pem sha256 leaf_ext rsa_padding_mode:pss rsa_pss_saltlen:32
issue leaf-pss-sha1.crt test.example.com rsa-2048-a.pkcs8.pem intermediate.crt ca-rsa-intermediate.pkcs8.pem sha1 leaf_ext rsa_padding_mode:pss rsa_pss_saltlen:20
# Self-signed leaves.
issue self-signed-sha1.crt test.example.com rsa-2048-a.pkcs8.pem self - sha1 self_ext
issue self-signed-md5.crt test.example.com rsa-2048-a.pkcs8.pem self - md5 self_ext
issue self-signed-rsa-1024.crt test.example.com rsa-1024.pkcs8.pem self - sha256 self_ext
issue self-signed-ec-p521.crt test.example.com ec-p521.pkcs8.pem self - sha512 self_ext
