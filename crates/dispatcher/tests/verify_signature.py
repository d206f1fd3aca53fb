"""Verifies a Tocsin delivery with the Standard Webhooks reference library (PyPI: standardwebhooks).

Usage: verify_signature.py SECRET HEADERS_JSON_FILE BODY_FILE
Prints "valid" and exits 0, or prints "invalid" and exits 3.
"""
import json
import sys

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

secret, headers_path, body_path = sys.argv[1:4]
with open(headers_path) as f:
    headers = json.load(f)
with open(body_path, "rb") as f:
    body = f.read()
try:
    Webhook(secret).verify(body, headers)
except WebhookVerificationError as error:
    print("invalid:", error)
    sys.exit(3)
print("valid")
