"""The check of the viewer run of deploy/ci/schemathesis.sh: a `viewer` admin key reads and
never writes. A 2xx answer to any method but GET fails the run (loaded only for that run, through
SCHEMATHESIS_HOOKS)."""

import schemathesis


@schemathesis.check
def no_write_succeeds(ctx, response, case):
    """A viewer key's POST, PATCH, PUT or DELETE is refused (403), never carried out."""
    if case.method.upper() != "GET" and 200 <= response.status_code < 300:
        raise AssertionError(
            f"{case.method} {case.formatted_path} succeeded ({response.status_code}) "
            "with a viewer key"
        )
