"""Drives Tocsin's SNS path with moto's SNS emulator (PyPI `moto[server]`), for
crates/ingest/tests/ingest/sns.rs.

Environment: MOTO_PORT (the port to serve moto's SNS on, 127.0.0.1), ENDPOINT (ingest's URL with
basic-auth credentials in it, as an SNS subscription is given), ALARM and OK (CloudWatch alarm
messages, JSON text). It serves moto's SNS, creates a topic and subscribes the endpoint over
HTTP. moto confirms HTTP subscriptions by itself, without posting the SubscriptionConfirmation
AWS posts; so this script posts that message (AWS's format, with moto's topic and a SubscribeURL
on moto) to the endpoint with the endpoint's credentials, and ingest fetches the URL from moto.
Then it publishes the alarm's ALARM and OK messages, which moto posts to the endpoint as SNS
Notifications (text/plain, the URL's credentials as basic authentication). Prints one JSON line
per step; exits non-zero if a step fails.
"""

import json
import os
import sys
import threading
import urllib.parse

import boto3
import requests
from moto.server import create_backend_app
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
        "SignatureVersion": "1",
        "Signature": "EXAMPLE",
        "SigningCertURL": f"{base}/SimpleNotificationService-0000.pem",
    }
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
        message_id = sns.publish(
            TopicArn=topic,
            Subject=f'{state}: "checkout-api-5xx-rate" in EU (Ireland)',
            Message=os.environ[state],
        )["MessageId"]
        print(json.dumps({"step": "published", "state": state, "message_id": message_id}))
    server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
