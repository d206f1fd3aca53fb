"""Drives Tocsin's SNS path with moto's SNS emulator (PyPI `moto[server]`), for
crates/ingest/tests/ingest/sns.rs.

Environment: MOTO_PORT (the port to serve moto's SNS on, 127.0.0.1), ENDPOINT (ingest's URL with
basic-auth credentials in it, as an SNS subscription is given), ALARM and OK (CloudWatch alarm
messages, JSON text). It serves moto's SNS, creates a topic and subscribes the endpoint over
HTTP. Then it publishes the alarm's ALARM and OK messages, which moto posts to the endpoint as
SNS Notifications (text/plain, the URL's credentials as basic authentication), signed with
SignatureVersion 2. Prints one JSON line per step; exits non-zero if a step fails.

Where moto 5 differs from AWS, the script makes it behave as AWS does:
- moto confirms HTTP subscriptions by itself, without posting the SubscriptionConfirmation AWS
  posts; so this script posts that message (AWS's format, with moto's topic and a SubscribeURL
  on moto), signed with the subscription's key as moto signs its notifications, and ingest
  fetches the URL from moto.
- moto names `https://sns.<region>.amazonaws.com/...` as every message's SigningCertURL, while
  it serves the certificate itself; the script points the URL at moto, as LocalStack's SNS does.
- moto's signed text leaves a notification's Subject out, where AWS's includes it; so the
  alarms are published without a subject (ingest reads the alarm from the Message).
"""

import json
import os
import sys
import threading
import urllib.parse

import base64

import boto3
import requests
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding
from moto.core import DEFAULT_ACCOUNT_ID
from moto.server import create_backend_app
from moto.sns import models
from werkzeug.serving import make_server

# moto reads the region of an unsigned request (the confirmation's GET) as us-east-1.
REGION = "us-east-1"


def main() -> int:
    port = int(os.environ["MOTO_PORT"])
    endpoint = os.environ["ENDPOINT"]
    # moto's SNS only, so that a plain GET of a SubscribeURL (no AWS signature) reaches SNS
    # (moto's all-services server sends unsigned requests to S3).
    app = create_backend_app("sns")
    server = make_server("127.0.0.1", port, app, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{port}"
    serve_certificates_from(base)
    sns = boto3.client(
        "sns",
        region_name=REGION,
        endpoint_url=base,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    topic = sns.create_topic(Name="tocsin-alarms")["TopicArn"]
    subscription = sns.subscribe(TopicArn=topic, Protocol="http", Endpoint=endpoint)
    print(json.dumps({"step": "subscribed", "subscription": subscription["SubscriptionArn"]}))

    token = "2336412f37fb687f5d51e6e241d09c805a5a57b30d712f794cc5f6a988666d92"
    subscribe_url = f"{base}/?" + urllib.parse.urlencode(
        {"Action": "ConfirmSubscription", "TopicArn": topic, "Token": token}
    )
    confirmation = {
        "Type": "SubscriptionConfirmation",
        "MessageId": "165545c9-2a5c-472c-8df2-7ff2be2b3b1b",
        "Token": token,
        "TopicArn": topic,
        "Message": f"You have chosen to subscribe to the topic {topic}.\n"
        "To confirm the subscription, visit the SubscribeURL included in this message.",
        "SubscribeURL": subscribe_url,
        "Timestamp": "2026-11-22T02:10:51.851Z",
    }
    sign(confirmation, subscription["SubscriptionArn"])
    answer = requests.post(
        endpoint,
        data=json.dumps(confirmation),
        headers={
            "Content-Type": "text/plain; charset=UTF-8",
            "x-amz-sns-message-type": "SubscriptionConfirmation",
            "x-amz-sns-topic-arn": topic,
        },
        timeout=30,
    )
    print(json.dumps({"step": "confirmation", "status": answer.status_code, "answer": answer.json()}))
    if answer.status_code != 202:
        return 1

    for state in ("ALARM", "OK"):
        message_id = sns.publish(TopicArn=topic, Message=os.environ[state])["MessageId"]
        print(json.dumps({"step": "published", "state": state, "message_id": message_id}))
    server.shutdown()
    return 0


def serve_certificates_from(base: str) -> None:
    """Makes every message moto posts name its certificate on moto itself."""
    get_post_data = models.Subscription.get_post_data

    def with_local_certificate(self, *args, **kwargs):
        data = get_post_data(self, *args, **kwargs)
        data["SigningCertURL"] = base + "/" + data["SigningCertURL"].rsplit("/", 1)[1]
        return data

    models.Subscription.get_post_data = with_local_certificate


def sign(message: dict, subscription_arn: str) -> None:
    """Signs a confirmation as moto signs its notifications: SignatureVersion 2, with the
    subscription's key, whose certificate moto then serves."""
    backend = models.sns_backends[DEFAULT_ACCOUNT_ID][REGION]
    subscription = backend.subscriptions[subscription_arn]
    # Has moto make (and serve) a certificate for the subscription's key.
    cert_url = subscription.get_post_data("certificate", "0", None)["SigningCertURL"]
    fields = ["Message", "MessageId", "SubscribeURL", "Timestamp", "Token", "TopicArn", "Type"]
    text = "".join(f"{name}\n{message[name]}\n" for name in fields)
    signature = subscription.private_key().sign(
        text.encode("utf-8"), padding.PKCS1v15(), hashes.SHA256()
    )
    message["SignatureVersion"] = "2"
    message["Signature"] = base64.b64encode(signature).decode("ascii")
    message["SigningCertURL"] = cert_url


if __name__ == "__main__":
    sys.exit(main())
