"""No console input reaches a 500: the cases found by hand (a NUL in a
filter or a note, a malformed cursor), then hypothesis over every page's
query string and every form, as bytes (NUL, invalid UTF-8, huge numbers,
times without an offset)."""

from __future__ import annotations

import urllib.parse

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.console_support import console_config, csrf_of
from tests.factories import park
from tests.rows import letter
from tests.support import Clock
from web import close_app


@pytest.fixture
def console(config):
    from web import create_app

    app = create_app(console_config(config), clock=Clock(running=True).utc)
    yield app
    close_app(app)


@pytest.fixture
def signed_in(console, make_key):
    client = console.test_client()
    token = csrf_of(client.get("/console/sign-in").get_data(as_text=True))
    key = make_key("ops-fuzz", admin=True)
    assert (
        client.post("/console/sign-in", data={"api_key": key, "csrf_token": token}).status_code
        == 302
    )
    return client


def token_of(client) -> str:
    return csrf_of(client.get("/console/dead-letters").get_data(as_text=True))


# -- the cases found by hand ----------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "/console/payments?payer=a%00",
        "/console/webhooks?cursor=nope",
        "/console/webhooks?only=stuck",
        "/console/webhooks?payer=" + "x" * 201,
        "/console/webhooks?cursor=a_b_c",
        "/console/webhooks?cursor=acme_not-a-time_0193a1c2-7d1e-7c4b-9a55-0c1d2e3f4a5b",
        "/console/webhooks?cursor=acme_2026-01-01T00:00:00_0193a1c2-7d1e-7c4b-9a55-0c1d2e3f4a5b",
        "/console/dead-letters?cursor=2026-01-01T00:00:00%2B00:00_99999999999999999999",
        "/console/reconciliation?cursor=-1",
        "/console/reconciliation?cursor=99999999999999999999",
        "/console/payments?payer=acme&cursor=x_y",
        "/console/payments?due_from=2026-01-01T10:00%2B99:00",
        "/console/payments?due_to=9999-12-31",
        "/console/payments?due_from=9999-12-31",
        "/console/payments?day=1999-12-31",
        "/console/dead-letters?parked_before=2026-01-01%00",
        "/console/dead-letters/all/dismiss?parked_before=99999-01-01",
        "/console/bulk/1?cursor=0193a1c2",
        "/console/payments/all/cancel?status=PENDING&payer=a%00",
        "/console/payments/all/cancel?status=PENDING&due_from=99999-01-01",
        "/console/history?range=30d",
        "/console/payments.csv?day=9999-12-31",
        "/console/webhooks/0193a1c2-7d1e-7c4b-9a55-0c1d2e3f4a5b?cursor=-1",
    ],
)
def test_bad_filters_and_cursors_are_a_400(signed_in, url):
    assert signed_in.get(url).status_code == 400


def test_a_dismiss_note_with_a_nul_is_a_400_and_changes_nothing(signed_in, conn):
    row = park(conn)
    answer = signed_in.post(
        f"/console/dead-letters/{row['id']}/dismiss",
        data={"csrf_token": token_of(signed_in), "note": "paid\x00 by wire"},
    )
    assert answer.status_code == 400
    assert letter(conn, row["id"])["resolution"] is None


# -- everything else -------------------------------------------------------------

FUZZ = settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

#: Each page with the fields it reads from its query string.
PAGES = {
    "/console/payments": [
        "id",
        "payer",
        "status",
        "day",
        "cursor",
        "due_from",
        "due_to",
        "processor",
        "failure_reason",
        "in_doubt",
    ],
    "/console/dead-letters": ["cursor", "reason", "payer", "parked_before", "processor"],
    "/console/dead-letters/all/dismiss": ["reason", "payer", "parked_before", "processor"],
    "/console/payments/all/cancel": [
        "payer",
        "status",
        "due_from",
        "due_to",
        "processor",
        "failure_reason",
        "in_doubt",
    ],
    "/console/bulk/1": ["cursor"],
    "/console/approvals": ["x"],
    "/console/audit": ["cursor"],
    "/console/audit.csv": ["x"],
    "/console/reconciliation": ["cursor", "day_before", "mismatches"],
    "/console/reconciliation/1": ["cursor"],
    "/console/webhooks": ["cursor", "payer", "only"],
    "/console/sign-in": ["next"],
    "/console/": ["x"],
    "/console/history": ["range", "x"],
    "/console/payments.csv": [
        "id",
        "payer",
        "status",
        "day",
        "cursor",
        "due_from",
        "due_to",
        "processor",
        "failure_reason",
        "in_doubt",
    ],
    "/console/webhooks/0193a1c2-7d1e-7c4b-9a55-0c1d2e3f4a5b": ["cursor"],
}

#: Values a person or a script might send: any bytes, and near-misses of
#: what the fields expect.
NEAR_MISSES = [
    b"FAILED",
    b"PENDING",
    b"RETRIES_EXHAUSTED",
    b"DECLINED",
    b"fake",
    b"yes",
    b"backlog",
    b"failing",
    b"2026-01-01T10:00",
    b"2026-01-01T10:00+05:00",
    b"9999-12-31",
    b"2026-02-30",
    b"2026-01-01",
    b"9999-12-31",
    b"7d",
    b"99999999999999999999",
    b"-1",
    b"0193a1c2-7d1e-7c4b-9a55-0c1d2e3f4a5b",
    b"2026-01-01T00:00:00+00:00_1",
    b"2026-01-01T00:00:00_0193a1c2-7d1e-7c4b-9a55-0c1d2e3f4a5b",
    b"a_2026-01-01T00:00:00+00:00_0193a1c2-7d1e-7c4b-9a55-0c1d2e3f4a5b",
    b"a_b_c",
    b"\x00",
    b"\xed\xa0\x80",
    b"//evil.example/",
]
VALUES = st.one_of(
    st.sampled_from(NEAR_MISSES),
    st.binary(max_size=30),
    st.text(max_size=30).map(str.encode),
    # a near miss spoiled: a NUL, a stray byte, a separator or a digit run added
    st.tuples(
        st.sampled_from(NEAR_MISSES),
        st.sampled_from([b"\x00", b"\xff", b"_", b"T", b"9" * 20, b"+99:00"]),
    ).map(lambda parts: parts[0] + parts[1]),
)


def _query(pairs) -> str:
    return "&".join(
        f"{name}={urllib.parse.quote_from_bytes(value, safe='')}" for name, value in pairs
    )


@pytest.mark.parametrize("page", list(PAGES))
@FUZZ
@given(data=st.data())
def test_no_query_string_reaches_a_500(signed_in, page, data):
    names = PAGES[page]
    pairs = list(data.draw(st.dictionaries(st.sampled_from(names), VALUES, max_size=3)).items())
    answer = signed_in.get(page, query_string=_query(pairs))
    assert answer.status_code < 500, (page, pairs, answer.status_code)


FORMS = [
    ("/console/dead-letters/{id}/dismiss", ["note"]),
    ("/console/dead-letters/{id}/redrive", ["note"]),
    ("/console/dead-letters/redrive-selected", ["payment_id", "payment_id", "confirmed"]),
    ("/console/sign-in", ["api_key", "next"]),
    ("/console/dead-letters/all/dismiss", ["payer", "note", "digest"]),
    ("/console/dead-letters/all/refund", ["reason", "parked_before", "note"]),
    ("/console/approvals/1/approve", ["x", "x", "x"]),
    ("/console/approvals/1/reject", ["x", "x", "x"]),
    ("/console/payments/{id}/cancel", ["reason", "x", "x"]),
    ("/console/payments/all/cancel", ["status", "note", "digest"]),
    ("/console/webhooks/{id}/deliveries/1/replay", ["x"]),
]


@FUZZ
@given(
    form=st.sampled_from(FORMS),
    values=st.lists(VALUES, min_size=3, max_size=3),
    extra=st.lists(
        st.tuples(st.sampled_from(["note", "next", "x", "payer", "processor"]), VALUES),
        max_size=2,
    ),
)
def test_no_form_reaches_a_500(signed_in, conn, form, values, extra):
    path, names = form
    row = park(conn)
    fields = [
        ("csrf_token", token_of(signed_in).encode()),
        *zip(names, values, strict=False),
        *extra,
    ]
    body = "&".join(
        f"{urllib.parse.quote(name)}={urllib.parse.quote_from_bytes(value, safe='')}"
        for name, value in fields
    )
    answer = signed_in.post(
        path.format(id=row["id"]),
        data=body,
        content_type="application/x-www-form-urlencoded",
    )
    assert answer.status_code < 500, (path, fields, answer.status_code)
