"""Authentication, roles and TLS through real clients: the ADBC Flight SQL driver (its
`username`/`password` options and its authorization-header option) and pyarrow.flight (its
Basic-token handshake and a Bearer header on every call), against `moraine serve --auth-file`.

The credentials files are made with moraine's own command line (`moraine user add`, `moraine
token create`; `--ttl 0` for a token that has already expired), and changed while a server
runs (`moraine token revoke`, `moraine user remove`) followed by SIGHUP; each test then waits
for the server's "reloaded credentials and certificates" line (polled, with a deadline) before
it checks anything. The TLS tests make their CAs and certificates with trustme.

Covered: logging in and reading (every role, both clients, password and token); missing,
wrong, unknown, malformed, expired and revoked credentials (UNAUTHENTICATED); removed and
re-roled users (their sessions end, an open transaction is rolled back); what each role may
do (a reader's every kind of write is PERMISSION_DENIED and changes nothing, while the same
calls by a writer succeed); token management by an admin over Flight (CreateToken,
ListTokens, RevokeToken: in force at once, refused to other roles); sessions (what one opens is invisible to another; --max-sessions);
TLS, mutual TLS and certificate reload; and the refusal to listen beyond loopback without
credentials.

Reads are compared with the fixture replayed in Python (`expected_rows()`); writes with the
state read first plus the rows written; a refused write with the state read before it (through
a writer) and with every byte of the data directory.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import adbc_driver_flightsql
import adbc_driver_flightsql.dbapi as flightsql
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from adbc_driver_manager import AdbcStatusCode

from conftest import (
    COLUMN_MAPPING,
    DATA_FILE,
    NAME_MAPPING,
    TABLES,
    CatalogState,
    Ids,
    Running,
    Server,
    _child_env,
    add_user,
    arrow_rows,
    column_names,
    create_token,
    data_file,
    diff_states,
    flat_mapping,
    moraine_bin,
    moraine_cli,
    sorted_rows,
    state_from_tables,
)
from test_bad_input import data_dir_hashes
from test_pyarrow_flight import SQL_PKG, _bytes_field, _varint_field, command
from test_writes_pyarrow import (
    MAPPING_PATH,
    committed,
    file_batches,
    finish_put,
    mapping_batches,
    put,
)

CALL_TIMEOUT_S = 30
RELOAD_TIMEOUT_S = 30
RELOADED = "reloaded credentials and certificates"

ROLES = ("reader", "writer", "admin")
# Each user is named after its role. The passwords hold a colon (Basic credentials split at
# the first one), spaces and non-ASCII letters.
PASSWORDS = {role: f"{role}: correct horse batterie agrafée" for role in ROLES}
# How a caller proves who it is: a user's password, or a pre-issued token.
KINDS = ("password", "token")

AUTH_HEADER = adbc_driver_flightsql.DatabaseOptions.AUTHORIZATION_HEADER.value
TLS_ROOT_CERTS = adbc_driver_flightsql.DatabaseOptions.TLS_ROOT_CERTS.value
MTLS_CERT_CHAIN = adbc_driver_flightsql.DatabaseOptions.MTLS_CERT_CHAIN.value
MTLS_PRIVATE_KEY = adbc_driver_flightsql.DatabaseOptions.MTLS_PRIVATE_KEY.value

REUSE_CONNECTION = "arrow-flight-reuse-connection://?"


# --------------------------------------------------------------------------------------------
# Credentials.


@dataclass
class Caller:
    """A user (`token` None: named `role`, logs in with its password) or a pre-issued token
    (named `token_name`) with `role`."""

    role: str
    token: Optional[str] = None
    token_name: Optional[str] = None
    user: Optional[str] = None
    password: Optional[str] = None

    @property
    def principal(self) -> str:
        """How the server names the caller in a refusal."""
        return f"token:{self.token_name}" if self.token else f"user:{self.user}"

    def db_kwargs(self) -> Dict[str, str]:
        """The ADBC database options that authenticate as this caller."""
        if self.token:
            return {AUTH_HEADER: f"Bearer {self.token}"}
        return {"username": self.user, "password": self.password}

    def headers(self, client: flight.FlightClient) -> List[Tuple[bytes, bytes]]:
        """The headers a pyarrow.flight call carries as this caller: for a user, the session
        token its Basic-token handshake returns; for a token, the token as a Bearer header."""
        if self.token:
            return [bearer(self.token)]
        key, value = client.authenticate_basic_token(self.user, self.password, options())
        assert key.lower() == b"authorization" and value.startswith(b"Bearer mrs_"), (
            f"the login answered {key!r}: {value!r}, expected a `Bearer mrs_…` session token")
        return [(key, value)]


@dataclass
class Credentials:
    file: Path
    tokens: Dict[str, str] = field(default_factory=dict)  # token name -> token

    def caller(self, role: str, kind: str) -> Caller:
        if kind == "token":
            name = f"{role}-token"
            return Caller(role, token=self.tokens[name], token_name=name)
        return Caller(role, user=role, password=PASSWORDS[role])


def make_credentials(directory: Path) -> Credentials:
    """A credentials file with a user per role (named after it), a token per role
    (`ROLE-token`) and a reader token that has already expired (`expired`)."""
    directory.mkdir(parents=True, exist_ok=True)
    creds = Credentials(directory / "credentials")
    for role in ROLES:
        add_user(creds.file, role, role, PASSWORDS[role])
        creds.tokens[f"{role}-token"] = create_token(creds.file, f"{role}-token", role)
    creds.tokens["expired"] = create_token(creds.file, "expired", "reader", ttl=0)
    return creds


def copy_credentials(creds: Credentials, directory: Path) -> Credentials:
    """The same users and tokens in a file of their own (for a server whose file a test
    changes)."""
    directory.mkdir(parents=True, exist_ok=True)
    copy = Credentials(directory / "credentials", dict(creds.tokens))
    shutil.copyfile(creds.file, copy.file)
    return copy


def reload(server: Server) -> str:
    """SIGHUP, then the server's reload line (as soon as it prints it, within
    RELOAD_TIMEOUT_S)."""
    mark = server.line_count
    server.proc.send_signal(signal.SIGHUP)
    line = server.wait_for_line(RELOADED, "reload failed", since=mark, timeout=RELOAD_TIMEOUT_S)
    if line is None:
        if server.proc.poll() is not None:
            pytest.fail(f"{server.name}: exited {server.proc.returncode} on SIGHUP:\n"
                        f"{server.log(since=mark)}", pytrace=False)
        pytest.fail(f"{server.name}: no `{RELOADED}` line within {RELOAD_TIMEOUT_S} s of "
                    f"SIGHUP; its output since:\n{server.log(since=mark)}", pytrace=False)
    if "reload failed" in line:
        pytest.fail(f"{server.name}: the reload failed: {line}", pytrace=False)
    return line


# --------------------------------------------------------------------------------------------
# Clients.


def options(headers: Sequence[Tuple[bytes, bytes]] = ()) -> flight.FlightCallOptions:
    return flight.FlightCallOptions(timeout=CALL_TIMEOUT_S, headers=list(headers))


def bearer(token: str) -> Tuple[bytes, bytes]:
    return (b"authorization", f"Bearer {token}".encode())


def basic(user: str, password: str, padding: bool = True) -> Tuple[bytes, bytes]:
    encoded = base64.b64encode(f"{user}:{password}".encode()).decode()
    if not padding:
        encoded = encoded.rstrip("=")
    return (b"authorization", f"Basic {encoded}".encode())


class HeaderRecorder(flight.ClientMiddlewareFactory):
    """Keeps the response headers of every call."""

    def __init__(self):
        self.received: List[Dict[str, list]] = []

    def start_call(self, info):
        return _Recording(self)


class _Recording(flight.ClientMiddleware):
    def __init__(self, factory: HeaderRecorder):
        self.factory = factory

    def received_headers(self, headers):
        self.factory.received.append({k.lower(): list(v) for k, v in headers.items()})


def state_rows(table: pa.Table):
    return sorted_rows(tuple(r.values()) for r in table.to_pylist())


def read_info(client: flight.FlightClient, uri: str, info: flight.FlightInfo,
              opts: flight.FlightCallOptions) -> pa.Table:
    """DoGet of every endpoint, on the same client and with the same headers (an endpoint
    may only point back at this server)."""
    parts = []
    for ep in info.endpoints:
        elsewhere = [loc.uri.decode() for loc in ep.locations
                     if loc.uri.decode() not in (uri, REUSE_CONNECTION)]
        assert not elsewhere, f"an endpoint points elsewhere: {elsewhere} (this server: {uri})"
        parts.append(client.do_get(ep.ticket, opts).read_all())
    return pa.concat_tables(parts) if parts else info.schema.empty_table()


def flight_state(client: flight.FlightClient, uri: str,
                 opts: flight.FlightCallOptions) -> CatalogState:
    """The three tables through plain Flight (GetFlightInfo of each path, then DoGet)."""
    tables = {}
    for table in TABLES:
        info = client.get_flight_info(flight.FlightDescriptor.for_path(table), opts)
        tables[table] = read_info(client, uri, info, opts)
    return state_from_tables(tables)


def adbc_connect(uri: str, db_kwargs: Dict[str, str], autocommit: bool = True, **extra):
    return flightsql.connect(uri, db_kwargs=dict(db_kwargs), autocommit=autocommit, **extra)


@contextlib.contextmanager
def adbc(uri: str, db_kwargs: Dict[str, str], autocommit: bool = True) -> Iterator[Any]:
    conn = adbc_connect(uri, db_kwargs, autocommit)
    try:
        yield conn
    finally:
        conn.close()


def adbc_state(conn) -> CatalogState:
    tables = {}
    with conn.cursor() as cur:
        for table in TABLES:
            cur.execute(f"SELECT * FROM {table}")
            tables[table] = cur.fetch_arrow_table()
    return state_from_tables(tables)


def scalar(conn, sql: str, params=None):
    with conn.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchone()[0]


def assert_state(got: CatalogState, want: CatalogState, what: str) -> None:
    diff = diff_states(got, want)
    if diff:
        pytest.fail(f"{what}:\n{diff}", pytrace=False)


def committed_state(uri: str, creds: Credentials) -> CatalogState:
    """What the store holds, read by the writer token through plain Flight."""
    with flight.FlightClient(uri) as client:
        return flight_state(client, uri, options([bearer(creds.tokens["writer-token"])]))


def action(client: flight.FlightClient, kind: str, body: bytes,
           opts: flight.FlightCallOptions) -> List[bytes]:
    """The Flight SQL action `kind` (its `Action<kind>Request` in a google.protobuf.Any)."""
    any_msg = _bytes_field(1, f"{SQL_PKG}Action{kind}Request".encode()) + _bytes_field(2, body)
    return [r.body.to_pybytes() for r in client.do_action(flight.Action(kind, any_msg), opts)]


def proto_fields(buf: bytes) -> Dict[int, bytes]:
    """The length-delimited fields of a protobuf message (enough for Any and the
    transaction results)."""
    out, pos = {}, 0
    while pos < len(buf):
        key, pos = _read_varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 2:
            n, pos = _read_varint(buf, pos)
            out[number] = buf[pos:pos + n]
            pos += n
        elif wire == 0:
            _, pos = _read_varint(buf, pos)
        else:
            raise AssertionError(f"unexpected wire type {wire} in {buf!r}")
    return out


def _read_varint(buf: bytes, pos: int) -> Tuple[int, int]:
    value = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, pos


def begin_transaction(client, opts) -> bytes:
    (result,) = action(client, "BeginTransaction", b"", opts)
    txn = proto_fields(proto_fields(result)[2])[1]  # Any.value -> transaction_id
    assert txn, f"BeginTransaction answered {result!r}"
    return txn


END_COMMIT, END_ROLLBACK = 1, 2


def end_transaction(client, opts, txn: bytes, end: int) -> None:
    action(client, "EndTransaction", _bytes_field(1, txn) + _varint_field(2, end), opts)


def put_stream(client, path: str, messages, opts) -> Optional[dict]:
    """One DoPut stream of (batch, app_metadata) messages with `opts` (headers); the reply's
    JSON."""
    return put(client, path, messages, options=opts)


def statement_update(client, sql: str, opts, txn: Optional[bytes] = None) -> None:
    """CommandStatementUpdate (in transaction `txn`, if given) through DoPut."""
    body = _bytes_field(1, sql.encode()) + (_bytes_field(2, txn) if txn is not None else b"")
    writer, reader = client.do_put(command("CommandStatementUpdate", body), pa.schema([]), opts)
    finish_put(writer, reader)


# --------------------------------------------------------------------------------------------
# Checking refusals.


def assert_adbc_unauthenticated(err: BaseException, *words: str) -> None:
    """ADBC's error for a gRPC UNAUTHENTICATED status: status UNAUTHENTICATED, the code in
    the message, and the server's reason."""
    msg = str(err)
    assert isinstance(err, flightsql.Error), f"not a DB-API error: {err!r}"
    assert getattr(err, "status_code", None) == AdbcStatusCode.UNAUTHENTICATED, (
        f"status {getattr(err, 'status_code', None)!r}, expected UNAUTHENTICATED: {msg}")
    assert "(Unauthenticated;" in msg or "code = Unauthenticated" in msg, msg
    for w in words:
        assert w in msg, f"the message does not say {w!r}: {msg}"


def assert_flight_unauthenticated(err: BaseException, *words: str) -> None:
    """pyarrow's error for UNAUTHENTICATED: FlightUnauthenticatedError (pyarrow's get_schema
    alone raises a plain OSError with Flight's own words for the status)."""
    msg = str(err)
    assert isinstance(err, flight.FlightUnauthenticatedError) or (
        isinstance(err, OSError) and "Flight returned unauthenticated error" in msg), \
        f"not FlightUnauthenticatedError: {err!r}"
    for w in words:
        assert w in msg, f"the message does not say {w!r}: {msg}"


def assert_permission_denied(err: BaseException, caller: Caller, what: str) -> None:
    """PERMISSION_DENIED naming the caller, its role and the role needed, from either client
    (pyarrow: FlightUnauthorizedError; ADBC: the status name in its message)."""
    msg = str(err)
    if isinstance(err, pa.ArrowException):
        assert isinstance(err, flight.FlightUnauthorizedError), \
            f"{what}: not FlightUnauthorizedError: {err!r}"
    else:
        assert isinstance(err, flightsql.Error), f"{what}: not a DB-API error: {err!r}"
        assert "PermissionDenied" in msg, f"{what}: not PERMISSION_DENIED: {msg}"
    for w in ("permission denied", f"{caller.principal} has role {caller.role}",
              "needs role writer"):
        assert w in msg, f"{what}: the message does not say {w!r}: {msg}"


# --------------------------------------------------------------------------------------------
# Servers.


@pytest.fixture(scope="module")
def creds(tmp_path_factory) -> Credentials:
    return make_credentials(tmp_path_factory.mktemp("auth") / "shared")


@pytest.fixture(scope="module")
def secured(server_factory, creds) -> Running:
    """The fixture imported, calls need credentials. Nothing is ever written to it."""
    return server_factory("auth", extra_args=["--auth-file", creds.file])


@pytest.fixture(scope="module")
def writable(server_factory, creds) -> Running:
    """The fixture imported, calls need credentials; the writers' tests write to it."""
    return server_factory("auth-writes", extra_args=["--auth-file", creds.file])


@pytest.fixture(scope="module")
def ids() -> Ids:
    return Ids()


# --------------------------------------------------------------------------------------------
# 1. Logging in, and reading.


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("kind", KINDS)
def test_adbc_login_reads_the_catalog(secured, creds, expected, kind, role):
    caller = creds.caller(role, kind)
    with adbc(secured.uri, caller.db_kwargs()) as conn:
        assert_state(adbc_state(conn), expected, f"the catalog read by {caller.principal}")
        # A bound parameter: a prepared statement, on the same session.
        table_id = expected[DATA_FILE][0][1]
        assert scalar(conn, "SELECT count(*) FROM ducklake_data_file WHERE table_id = ?",
                      [table_id]) == len(expected.rows_of_table_id(DATA_FILE, table_id))
        # Metadata calls.
        objects = conn.adbc_get_objects(depth="tables").read_all().to_pylist()
        tables = {t["table_name"] for c in objects for s in c["catalog_db_schemas"] or []
                  for t in s["db_schema_tables"] or []}
        assert set(TABLES) <= tables, tables


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("kind", KINDS)
def test_flight_login_reads_the_catalog(secured, creds, expected, kind, role):
    caller = creds.caller(role, kind)
    with flight.FlightClient(secured.uri) as client:
        opts = options(caller.headers(client))
        paths = sorted(i.descriptor.path[0].decode() for i in client.list_flights(options=opts))
        assert paths == sorted(TABLES)
        assert_state(flight_state(client, secured.uri, opts), expected,
                     f"the catalog read by {caller.principal}")


@pytest.mark.parametrize("padding", [True, False], ids=["padded", "unpadded"])
def test_basic_credentials_on_any_call_log_in(secured, creds, expected, padding):
    """Basic credentials on a call other than Handshake (as the ADBC driver sends them) log
    in too, with or without base64 padding; the response carries a new session token, which
    later calls use alone."""
    user, password = "reader", PASSWORDS["reader"]
    assert len(f"{user}:{password}".encode()) % 3, "the credentials must need padding"
    recorder = HeaderRecorder()
    with flight.FlightClient(secured.uri, middleware=[recorder]) as client:
        info = client.get_flight_info(flight.FlightDescriptor.for_path(COLUMN_MAPPING),
                                      options([basic(user, password, padding)]))
        tokens = [v for h in recorder.received for v in h.get("authorization", [])]
        assert len(tokens) == 1 and tokens[0].startswith("Bearer mrs_"), \
            f"the login's response carried authorization {tokens}"
        got = read_info(client, secured.uri, info, options([bearer(tokens[0][len("Bearer "):])]))
    assert state_rows(got) == expected[COLUMN_MAPPING]
    # A new login each time: every login is a session of its own.
    again = HeaderRecorder()
    with flight.FlightClient(secured.uri, middleware=[again]) as client:
        list(client.list_flights(options=options([basic(user, password, padding)])))
    other = [v for h in again.received for v in h.get("authorization", [])]
    assert other and other != tokens, f"two logins got {tokens} and {other}"


# --------------------------------------------------------------------------------------------
# 2, 3. Missing, wrong, unknown and expired credentials.

NO_CREDENTIALS = "this server needs credentials"
WRONG_LOGIN = "wrong username or password"
UNKNOWN_TOKEN = "the bearer token is unknown, expired or revoked"
EXPIRED = "the bearer token has expired"


def adbc_unauthenticated_cases(creds: Credentials) -> List[Tuple[str, Dict[str, str], str]]:
    return [
        ("no credentials", {}, NO_CREDENTIALS),
        ("wrong password", {"username": "reader", "password": PASSWORDS["writer"]}, WRONG_LOGIN),
        ("unknown user", {"username": "nobody", "password": PASSWORDS["reader"]}, WRONG_LOGIN),
        ("another user's password", {"username": "admin", "password": PASSWORDS["reader"]},
         WRONG_LOGIN),
        ("made-up token", {AUTH_HEADER: "Bearer mrt_" + "A" * 43}, UNKNOWN_TOKEN),
        ("a token's prefix", {AUTH_HEADER: "Bearer " + creds.tokens["reader-token"][:-1]},
         UNKNOWN_TOKEN),
        ("expired token", {AUTH_HEADER: "Bearer " + creds.tokens["expired"]}, EXPIRED),
        ("Basic header, wrong password",
         {AUTH_HEADER: basic("reader", "wrong")[1].decode()}, WRONG_LOGIN),
    ]


def test_adbc_without_valid_credentials_is_unauthenticated(secured, creds):
    failures = []
    for name, kwargs, reason in adbc_unauthenticated_cases(creds):
        try:
            with adbc(secured.uri, kwargs) as conn:
                got = scalar(conn, "SELECT count(*) FROM ducklake_data_file")
            failures.append(f"{name}: accepted, read {got}")
            continue
        except flightsql.Error as err:
            try:
                assert_adbc_unauthenticated(err, reason)
            except AssertionError as wrong:
                failures.append(f"{name}: {wrong}")
    assert not failures, "\n".join(failures)


def test_flight_without_valid_credentials_is_unauthenticated(secured, creds):
    # A ticket and a transaction a logged-in reader got, replayed without its credentials.
    with flight.FlightClient(secured.uri) as client:
        reader = options(creds.caller("reader", "token").headers(client))
        info = client.get_flight_info(flight.FlightDescriptor.for_path(DATA_FILE), reader)
        ticket = info.endpoints[0].ticket
    no_headers = options()
    calls: List[Tuple[str, Callable[[flight.FlightClient, flight.FlightCallOptions], Any]]] = [
        ("ListFlights", lambda c, o: list(c.list_flights(options=o))),
        ("GetFlightInfo", lambda c, o: c.get_flight_info(
            flight.FlightDescriptor.for_path(DATA_FILE), o)),
        ("GetSchema", lambda c, o: c.get_schema(flight.FlightDescriptor.for_path(DATA_FILE), o)),
        ("DoGet of a reader's ticket", lambda c, o: c.do_get(ticket, o).read_all()),
        ("DoPut", lambda c, o: put_stream(c, DATA_FILE, committed([]), o)),
        ("BeginTransaction", lambda c, o: begin_transaction(c, o)),
        ("ListActions", lambda c, o: list(c.list_actions(o))),
    ]
    headers = [
        ("no credentials", [], NO_CREDENTIALS),
        ("wrong password", [basic("reader", "wrong")], WRONG_LOGIN),
        ("unknown user", [basic("nobody", PASSWORDS["reader"])], WRONG_LOGIN),
        ("made-up token", [bearer("mrt_" + "A" * 43)], UNKNOWN_TOKEN),
        ("made-up session", [bearer("mrs_" + "A" * 43)], UNKNOWN_TOKEN),
        ("expired token", [bearer(creds.tokens["expired"])], EXPIRED),
        ("not base64", [(b"authorization", b"Basic !!!")], "not base64"),
        ("no colon", [(b"authorization", b"Basic " + base64.b64encode(b"reader"))], "no `:`"),
        ("another scheme", [(b"authorization", b"Digest abc")], "not `Basic"),
        ("empty bearer", [(b"authorization", b"Bearer ")], "not `Basic"),
    ]
    failures = []
    with flight.FlightClient(secured.uri) as client:
        for header_name, hs, reason in headers:
            for call_name, call in calls:
                what = f"{call_name} with {header_name}"
                try:
                    call(client, options(hs))
                    failures.append(f"{what}: accepted")
                except (pa.ArrowException, OSError) as err:
                    try:
                        assert_flight_unauthenticated(err, reason)
                    except AssertionError as wrong:
                        failures.append(f"{what}: {wrong}")
        # The handshake itself.
        for user, password in [("reader", "wrong"), ("nobody", "x"), ("reader", "")]:
            with pytest.raises(pa.ArrowException) as e:
                client.authenticate_basic_token(user, password, no_headers)
            assert_flight_unauthenticated(e.value, WRONG_LOGIN)
    assert not failures, "\n".join(failures)


def test_unknown_user_and_wrong_password_read_the_same(secured):
    """A refusal does not tell which users exist."""
    messages = []
    with flight.FlightClient(secured.uri) as client:
        for user in ("reader", "nobody"):
            with pytest.raises(flight.FlightUnauthenticatedError) as e:
                client.authenticate_basic_token(user, "wrong", options())
            messages.append(str(e.value))
    assert messages[0] == messages[1], messages


def test_an_expired_token_is_refused_and_listed_as_expired(secured, creds, expected):
    token = creds.tokens["expired"]
    with pytest.raises(flightsql.Error) as e:
        with adbc(secured.uri, {AUTH_HEADER: f"Bearer {token}"}) as conn:
            scalar(conn, "SELECT 1")
    assert_adbc_unauthenticated(e.value, EXPIRED)
    with flight.FlightClient(secured.uri) as client:
        with pytest.raises(pa.ArrowException) as e:
            list(client.list_flights(options=options([bearer(token)])))
        assert_flight_unauthenticated(e.value, EXPIRED)
        # A token of the same role that has not expired reads.
        live = options([bearer(creds.tokens["reader-token"])])
        assert_state(flight_state(client, secured.uri, live), expected, "with a live token")
    listed = moraine_cli("token", "list", "--auth-file", creds.file).stdout
    line = next(l for l in listed.splitlines() if l.startswith("expired\t"))
    assert "\treader\t" in line and "\texpired" in line, listed


# --------------------------------------------------------------------------------------------
# 4. Revoked tokens and removed users (SIGHUP).


@pytest.fixture(scope="module")
def reloading(server_factory, creds, tmp_path_factory) -> Tuple[Running, Credentials]:
    """A server whose credentials file the tests change (a copy of the shared one)."""
    own = copy_credentials(creds, tmp_path_factory.mktemp("auth") / "reloading")
    return server_factory("auth-reload", extra_args=["--auth-file", own.file]), own


def test_a_revoked_token_is_refused_after_reload(reloading, expected):
    running, creds = reloading
    token = create_token(creds.file, "revocable", "reader")
    # Not known to the server until it rereads the file.
    with flight.FlightClient(running.uri) as client:
        with pytest.raises(pa.ArrowException) as e:
            list(client.list_flights(options=options([bearer(token)])))
        assert_flight_unauthenticated(e.value, UNKNOWN_TOKEN)
    reload(running.server)

    kwargs = {AUTH_HEADER: f"Bearer {token}"}
    held = adbc_connect(running.uri, kwargs)
    try:
        assert_state(adbc_state(held), expected, "read with the token")
        with flight.FlightClient(running.uri) as client:
            opts = options([bearer(token)])
            assert_state(flight_state(client, running.uri, opts), expected,
                         "read with the token through Flight")
            kept = options([bearer(creds.tokens["reader-token"])])
            list(client.list_flights(options=kept))

            moraine_cli("token", "revoke", "revocable", "--auth-file", creds.file)
            # Still in force until the reload.
            list(client.list_flights(options=opts))
            reload(running.server)

            with pytest.raises(pa.ArrowException) as e:
                list(client.list_flights(options=opts))
            assert_flight_unauthenticated(e.value, UNKNOWN_TOKEN)
            # Other tokens are still good.
            assert_state(flight_state(client, running.uri, kept), expected,
                         "another token after the reload")
        # The connection opened before the revocation, and a new one.
        with pytest.raises(flightsql.Error) as e:
            scalar(held, "SELECT count(*) FROM ducklake_data_file")
        assert_adbc_unauthenticated(e.value, UNKNOWN_TOKEN)
    finally:
        held.close()
    with pytest.raises(flightsql.Error) as e:
        with adbc(running.uri, kwargs) as conn:
            scalar(conn, "SELECT 1")
    assert_adbc_unauthenticated(e.value, UNKNOWN_TOKEN)
    listed = moraine_cli("token", "list", "--auth-file", creds.file).stdout
    assert not any(l.startswith("revocable\t") for l in listed.splitlines()), listed


def test_removing_a_user_ends_its_sessions_and_rolls_back_its_transaction(reloading, ids):
    running, creds = reloading
    password = "leaving: soon"
    add_user(creds.file, "leaver", "writer", password)
    reload(running.server)
    before = committed_state(running.uri, creds)

    with flight.FlightClient(running.uri) as client:
        session = options(Caller("writer", user="leaver", password=password).headers(client))
        list(client.list_flights(options=session))
        reader = options(creds.caller("reader", "password").headers(client))
        # The leaver's open transaction, with a mapping ingested in it (one that would
        # commit).
        conn = adbc_connect(running.uri, {"username": "leaver", "password": password},
                            autocommit=False)
        try:
            m = flat_mapping(ids.file(), ids.table(), 2)
            with conn.cursor() as cur:
                cur.adbc_ingest(COLUMN_MAPPING, arrow_rows(COLUMN_MAPPING, [m.column_row]),
                                mode="append")
                cur.adbc_ingest(NAME_MAPPING, arrow_rows(NAME_MAPPING, m.name_rows),
                                mode="append")
                cur.execute("SELECT count(*) FROM ducklake_column_mapping WHERE mapping_id = ?",
                            [m.mapping_id])
                assert cur.fetchone()[0] == 1, "the transaction sees its own row"

            moraine_cli("user", "remove", "leaver", "--auth-file", creds.file)
            line = reload(running.server)
            assert "sessions_ended=" in line and "sessions_ended=0" not in line, line

            with pytest.raises(pa.ArrowException) as e:
                list(client.list_flights(options=session))
            assert_flight_unauthenticated(e.value, UNKNOWN_TOKEN)
            with pytest.raises(pa.ArrowException) as e:
                client.authenticate_basic_token("leaver", password, options())
            assert_flight_unauthenticated(e.value, WRONG_LOGIN)
            with pytest.raises(flightsql.Error) as e:
                conn.commit()
            assert_adbc_unauthenticated(e.value, UNKNOWN_TOKEN)
        finally:
            conn.close()
        # Another user's session goes on.
        list(client.list_flights(options=reader))
    assert_state(committed_state(running.uri, creds), before,
                 "the removed user's open transaction wrote")


def test_changing_a_users_role_ends_its_sessions(reloading):
    running, creds = reloading
    password = "changing: roles"
    add_user(creds.file, "changer", "writer", password)
    reload(running.server)
    with flight.FlightClient(running.uri) as client:
        as_writer = options(Caller("writer", user="changer", password=password).headers(client))
        txn = begin_transaction(client, as_writer)
        end_transaction(client, as_writer, txn, END_ROLLBACK)
        add_user(creds.file, "changer", "reader", password)
        reload(running.server)
        with pytest.raises(pa.ArrowException) as e:
            list(client.list_flights(options=as_writer))
        assert_flight_unauthenticated(e.value, UNKNOWN_TOKEN)
        caller = Caller("reader", user="changer", password=password)
        as_reader = options(caller.headers(client))
        list(client.list_flights(options=as_reader))
        with pytest.raises(pa.ArrowException) as e:
            begin_transaction(client, as_reader)
        assert_permission_denied(e.value, caller, "BeginTransaction after the demotion")


def test_connections_sharing_a_token_have_their_own_transactions(writable, creds, ids):
    """Two ADBC connections with one pre-issued token (two mirrors, a loader and a notebook):
    each untagged ingest joins the transaction its own connection began, neither sees the
    other's rows, one closing (CloseSession) leaves the other's transaction open, and the
    commit holds exactly its own connection's rows."""
    caller = creds.caller("writer", "token")
    before = committed_state(writable.uri, creds)
    first = adbc_connect(writable.uri, caller.db_kwargs(), autocommit=False)
    second = adbc_connect(writable.uri, caller.db_kwargs(), autocommit=False)
    try:
        mine, theirs = (flat_mapping(ids.file(), ids.table(), 2) for _ in range(2))
        for conn, m in ((first, mine), (second, theirs)):
            with conn.cursor() as cur:
                cur.adbc_ingest(COLUMN_MAPPING, arrow_rows(COLUMN_MAPPING, [m.column_row]),
                                mode="append")
                cur.adbc_ingest(NAME_MAPPING, arrow_rows(NAME_MAPPING, m.name_rows),
                                mode="append")
        for conn, m, other in ((first, mine, theirs), (second, theirs, mine)):
            seen = scalar(conn, "SELECT count(*) FROM ducklake_column_mapping "
                                f"WHERE mapping_id IN ({m.mapping_id}, {other.mapping_id})")
            own = scalar(conn, "SELECT count(*) FROM ducklake_column_mapping "
                               f"WHERE mapping_id = {m.mapping_id}")
            assert (seen, own) == (1, 1), (
                f"a connection's transaction holds {seen} of the two connections' mappings "
                f"({own} its own): an untagged ingest joined the other connection's")
        second.close()  # CloseSession: only the second connection's session ends
        first.commit()
    finally:
        first.close()
    assert_state(committed_state(writable.uri, creds), mine.added_to(before),
                 "the first connection's commit")


# --------------------------------------------------------------------------------------------
# 4b. Token management by an admin over Flight (CreateToken, ListTokens, RevokeToken).

ADMIN_ACTIONS = ("CreateToken", "ListTokens", "RevokeToken")


def admin_action(client: flight.FlightClient, kind: str, body: Optional[dict],
                 opts: flight.FlightCallOptions) -> dict:
    """The admin action `kind` with `body` as JSON; its one result, parsed."""
    payload = b"" if body is None else json.dumps(body).encode()
    results = [r.body.to_pybytes() for r in client.do_action(flight.Action(kind, payload), opts)]
    assert len(results) == 1, f"{kind} answered {len(results)} results"
    return json.loads(results[0])


def test_an_admin_manages_tokens_over_flight_and_they_take_effect_at_once(reloading,
                                                                          expected):
    running, creds = reloading
    with flight.FlightClient(running.uri) as client:
        admin = options(creds.caller("admin", "password").headers(client))
        kinds = {a.type for a in client.list_actions(admin)}
        assert set(ADMIN_ACTIONS) <= kinds, kinds

        created = admin_action(client, "CreateToken",
                               {"name": "remote", "role": "reader", "ttl_seconds": 3600}, admin)
        token = created["token"]
        assert (created["name"], created["role"]) == ("remote", "reader"), created
        assert token.startswith("mrt_") and len(token) == 47, created
        assert abs(created["expires"] - (time.time() + 3600)) < 300, created
        # In force at once, without a reload; stored as its hash only.
        held = options([bearer(token)])
        assert_state(flight_state(client, running.uri, held), expected, "read with the token")
        text = creds.file.read_text()
        assert token not in text and "token remote reader sha256:" in text, text
        listed = admin_action(client, "ListTokens", None, admin)
        assert token not in json.dumps(listed), listed
        by_name = {t["name"]: t for t in listed["tokens"]}
        assert by_name["remote"] == {"name": "remote", "role": "reader",
                                     "expires": created["expires"]}, by_name
        assert by_name["writer-token"]["expires"] is None, by_name
        cli = moraine_cli("token", "list", "--auth-file", creds.file).stdout
        assert any(line.startswith("remote\treader\t") for line in cli.splitlines()), cli

        # A taken name, a bad role, a body that is not JSON: refused, naming the problem.
        for body, words in [
            (json.dumps({"name": "remote", "role": "reader"}).encode(), ["already exists"]),
            (json.dumps({"name": "other", "role": "superuser"}).encode(), ["superuser"]),
            (json.dumps({"name": "other"}).encode(), ['"role"']),
            (b"{not json", ["not JSON"]),
            (json.dumps({"name": "bad name!", "role": "reader"}).encode(), ["bad name!"]),
        ]:
            with pytest.raises(pa.ArrowException) as e:
                list(client.do_action(flight.Action("CreateToken", body), admin))
            for w in words:
                assert w in str(e.value), f"{body!r}: the refusal does not say {w!r}: {e.value}"

        # Writers and readers may not manage tokens, and the file stays as it was.
        before = creds.file.read_bytes()
        for role in ("writer", "reader"):
            caller = creds.caller(role, "token")
            opts = options(caller.headers(client))
            for kind, body in [("CreateToken", {"name": "mine", "role": "admin"}),
                               ("ListTokens", None), ("RevokeToken", {"name": "remote"})]:
                with pytest.raises(flight.FlightUnauthorizedError) as e:
                    admin_action(client, kind, body, opts)
                for w in ("permission denied", f"{caller.principal} has role {role}",
                          "needs role admin"):
                    assert w in str(e.value), f"{kind} by {role}: {e.value}"
        assert creds.file.read_bytes() == before, "a refused action changed the file"
        assert_state(flight_state(client, running.uri, held), expected, "the token still reads")

        # Revoking ends the token's session at once.
        revoked = admin_action(client, "RevokeToken", {"name": "remote"}, admin)
        assert revoked == {"name": "remote", "sessions_ended": 1}, revoked
        with pytest.raises(pa.ArrowException) as e:
            list(client.list_flights(options=held))
        assert_flight_unauthenticated(e.value, UNKNOWN_TOKEN)
        assert "token remote " not in creds.file.read_text()
        with pytest.raises(pa.ArrowException) as e:
            admin_action(client, "RevokeToken", {"name": "remote"}, admin)
        assert "token remote not found" in str(e.value), e.value


def test_token_management_needs_a_credentials_file(server_factory):
    running = server_factory("auth-none", steps_file=None)
    with flight.FlightClient(running.uri) as client:
        with pytest.raises(pa.ArrowNotImplementedError) as e:
            admin_action(client, "CreateToken", {"name": "t", "role": "reader"}, options())
        assert "--auth-file" in str(e.value), e.value


# --------------------------------------------------------------------------------------------
# 5, 6. Roles: what a reader may not do, and what it leaves behind (nothing).


def sql_value(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return str(value)
    return "'" + str(value).replace("'", "''") + "'"


@dataclass
class Write:
    name: str
    call: Callable[[str, flight.FlightClient, flight.FlightCallOptions], Any]
    # Whether a writer's same call succeeds (so a reader's refusal is down to the role alone).
    writer_succeeds: bool = True


def write_attempts(caller: Caller, state: CatalogState, ids: Ids) -> List[Write]:
    """Every way to write, through both clients, as `caller`: in this order, each a valid
    write a writer may make on a store in `state` (one excepted, marked)."""
    file_id, table_id = live_file(state)
    dropped, kept = flat_mapping(ids.file(), ids.table(), 2), flat_mapping(ids.file(),
                                                                           ids.table(), 3)
    t = ids.table()
    ingested, inserted, bound = (data_file(ids.file(), t, None) for _ in range(3))
    streamed = data_file(ids.file(), kept.table_id, kept.mapping_id)

    def adbc_call(body):
        def run(uri, client, opts):
            with adbc(uri, caller.db_kwargs()) as conn:
                with conn.cursor() as cur:
                    body(cur)
        return run

    def execute(sql, params=None):
        return adbc_call(lambda cur: cur.execute(sql, params))

    def transaction(uri, client, opts):
        conn = adbc_connect(uri, caller.db_kwargs(), autocommit=False)
        conn.close()

    marks = ", ".join("?" for _ in column_names(DATA_FILE))
    return [
        Write("DoPut of a mapping stream", lambda uri, client, opts: put_stream(
            client, MAPPING_PATH, committed(mapping_batches([dropped, kept])), opts)),
        Write("DoPut of a data-file stream", lambda uri, client, opts: put_stream(
            client, DATA_FILE, committed(file_batches([streamed])), opts)),
        Write("ADBC DELETE of a table's mappings", execute(
            f"DELETE FROM ducklake_column_mapping WHERE table_id IN ({dropped.table_id})")),
        Write("ADBC ingest of a data file", adbc_call(lambda cur: cur.adbc_ingest(
            DATA_FILE, arrow_rows(DATA_FILE, [ingested]), mode="append"))),
        Write("ADBC INSERT", execute(
            f"INSERT INTO ducklake_data_file VALUES ({', '.join(map(sql_value, inserted))})")),
        Write("ADBC INSERT with parameters", execute(
            f"INSERT INTO ducklake_data_file VALUES ({marks})", list(bound))),
        Write("ADBC UPDATE", execute(
            f"UPDATE ducklake_data_file SET end_snapshot = 1000000 WHERE end_snapshot IS NULL "
            f"AND data_file_id IN ({file_id})")),
        Write("ADBC UPDATE by table", execute(
            f"UPDATE ducklake_data_file SET end_snapshot = 1000000 WHERE end_snapshot IS NULL "
            f"AND table_id IN ({table_id})")),
        Write("ADBC DELETE of a data file", execute(
            f"DELETE FROM ducklake_data_file WHERE data_file_id IN ({ingested[0]})")),
        Write("ADBC DELETE with a parameter", execute(
            "DELETE FROM ducklake_data_file WHERE data_file_id IN (?)", [inserted[0]])),
        Write("DoPut of CommandStatementUpdate", lambda uri, client, opts: statement_update(
            client, f"DELETE FROM ducklake_data_file WHERE data_file_id IN ({bound[0]})",
            opts)),
        Write("ADBC connection with autocommit off (BeginTransaction)", transaction),
        Write("BeginTransaction", lambda uri, client, opts: begin_transaction(client, opts)),
        Write("EndTransaction (commit) of a made-up transaction",
              lambda uri, client, opts: end_transaction(client, opts, b"feedface", END_COMMIT),
              writer_succeeds=False),
    ]


def live_file(state: CatalogState) -> Tuple[int, int]:
    """(data_file_id, table_id) of a live data file."""
    names = column_names(DATA_FILE)
    for r in state[DATA_FILE]:
        rec = dict(zip(names, r))
        if rec["end_snapshot"] is None:
            return rec["data_file_id"], rec["table_id"]
    raise AssertionError("no live data file")


@pytest.mark.parametrize("kind", KINDS)
def test_a_reader_may_not_write_and_nothing_is_written(secured, creds, expected, ids, kind):
    caller = creds.caller("reader", kind)
    before = committed_state(secured.uri, creds)
    assert_state(before, expected, "before")
    hashes = data_dir_hashes(secured.server.data_dir)
    failures = []
    with flight.FlightClient(secured.uri) as client:
        opts = options(caller.headers(client))
        for write in write_attempts(caller, before, ids):
            try:
                write.call(secured.uri, client, opts)
                failures.append(f"{write.name}: accepted")
                continue
            except (flightsql.Error, pa.ArrowException) as err:
                try:
                    assert_permission_denied(err, caller, write.name)
                except AssertionError as wrong:
                    failures.append(str(wrong))
            # The reader still reads, on the same session.
            client.get_flight_info(flight.FlightDescriptor.for_path(COLUMN_MAPPING), opts)
    assert not failures, "\n".join(failures)
    assert_state(committed_state(secured.uri, creds), before, "after the refused writes")
    assert data_dir_hashes(secured.server.data_dir) == hashes, "the data directory changed"


def test_a_reader_connecting_with_autocommit_off_is_refused(secured, creds):
    """ADBC sends BeginTransaction as it connects with autocommit off (its default here, as
    the server advertises transactions): a reader's connection is refused there."""
    caller = creds.caller("reader", "password")
    with pytest.raises(flightsql.Error) as e:
        conn = flightsql.connect(secured.uri, db_kwargs=caller.db_kwargs())
        conn.close()
    assert_permission_denied(e.value, caller, "connect with autocommit off")
    assert "a transaction" in str(e.value), str(e.value)


# --------------------------------------------------------------------------------------------
# 5. Writers and admins write.


def test_a_writer_makes_the_writes_a_reader_may_not(writable, creds, ids):
    """The same calls as a reader's refused writes, made by a writer: each is accepted, so a
    reader's refusal is down to its role alone."""
    caller = creds.caller("writer", "token")
    failures = []
    with flight.FlightClient(writable.uri) as client:
        opts = options(caller.headers(client))
        for write in write_attempts(caller, committed_state(writable.uri, creds), ids):
            if not write.writer_succeeds:
                continue
            try:
                write.call(writable.uri, client, opts)
            except (flightsql.Error, pa.ArrowException) as err:
                failures.append(f"{write.name}: {err}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("role", ["writer", "admin"])
@pytest.mark.parametrize("kind", KINDS)
def test_writers_and_admins_write(writable, creds, ids, kind, role):
    caller = creds.caller(role, kind)
    uri = writable.uri
    state = committed_state(uri, creds)

    # A transaction (autocommit off): ingest a mapping and a data file, commit.
    m = flat_mapping(ids.file(), ids.table(), 3)
    f = data_file(ids.file(), m.table_id, m.mapping_id)
    with adbc(uri, caller.db_kwargs(), autocommit=False) as conn:
        with conn.cursor() as cur:
            cur.adbc_ingest(COLUMN_MAPPING, arrow_rows(COLUMN_MAPPING, [m.column_row]),
                            mode="append")
            cur.adbc_ingest(NAME_MAPPING, arrow_rows(NAME_MAPPING, m.name_rows), mode="append")
            cur.adbc_ingest(DATA_FILE, arrow_rows(DATA_FILE, [f]), mode="append")
        conn.commit()
    state = m.added_to(state).with_rows(DATA_FILE, [f])
    assert_state(committed_state(uri, creds), state, f"after {caller.principal}'s ingest")

    # DML with autocommit on: retire the file, then delete it.
    with adbc(uri, caller.db_kwargs()) as conn:
        with conn.cursor() as cur:
            cur.execute(f"UPDATE ducklake_data_file SET end_snapshot = 2 "
                        f"WHERE end_snapshot IS NULL AND data_file_id IN ({f[0]})")
            assert cur.rowcount == 1, cur.rowcount
    state = state.with_changes(DATA_FILE, lambda r: r["data_file_id"] == f[0], end_snapshot=2)
    assert_state(committed_state(uri, creds), state, f"after {caller.principal}'s UPDATE")
    with adbc(uri, caller.db_kwargs()) as conn:
        with conn.cursor() as cur:
            cur.execute("DELETE FROM ducklake_data_file WHERE data_file_id IN (?)", [f[0]])
    state = state.without_rows(DATA_FILE, lambda r: r["data_file_id"] == f[0])
    assert_state(committed_state(uri, creds), state, f"after {caller.principal}'s DELETE")

    # Plain Flight: a DoPut stream, and a transaction through the actions.
    g = data_file(ids.file(), m.table_id, m.mapping_id)
    with flight.FlightClient(uri) as client:
        opts = options(caller.headers(client))
        reply = put_stream(client, DATA_FILE, committed(file_batches([g])), opts)
        assert reply and reply.get("committed") is True and reply.get("data_files") == 1, reply
        state = state.with_rows(DATA_FILE, [g])
        assert_state(committed_state(uri, creds), state, f"after {caller.principal}'s DoPut")
        txn = begin_transaction(client, opts)
        statement_update(client, f"DELETE FROM ducklake_data_file WHERE data_file_id IN "
                                 f"({g[0]})", opts, txn)
        end_transaction(client, opts, txn, END_ROLLBACK)
    assert_state(committed_state(uri, creds), state,
                 f"after {caller.principal}'s rolled-back transaction")


# --------------------------------------------------------------------------------------------
# 7-9. TLS, mutual TLS, certificates reloaded on SIGHUP.

# Each pyarrow client gets connections of its own (gRPC would otherwise share a connection
# between clients with equal settings, and a test that expects a new handshake would not
# make one).
OWN_CONNECTIONS = [("grpc.use_local_subchannel_pool", 1)]


def tls_uri(running: Running, host: str = "127.0.0.1") -> str:
    assert running.uri.startswith("grpc://127.0.0.1:"), running.uri
    return running.uri.replace("grpc://127.0.0.1:", f"grpc+tls://{host}:")


def pem(blobs) -> bytes:
    return b"".join(b.bytes() for b in blobs)


def write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".new")
    tmp.write_bytes(data)
    os.replace(tmp, path)


@dataclass
class ServerCert:
    """A server certificate for 127.0.0.1 and localhost from `ca`, written where `serve
    --tls-cert/--tls-key` read it."""

    ca: Any
    cert: Path
    key: Path

    @classmethod
    def issue(cls, ca, directory: Path) -> "ServerCert":
        directory.mkdir(parents=True, exist_ok=True)
        made = cls(ca, directory / "server.pem", directory / "server.key")
        made.reissue(ca)
        return made

    def reissue(self, ca) -> None:
        leaf = ca.issue_cert("127.0.0.1", "localhost")
        write_atomically(self.key, leaf.private_key_pem.bytes())
        write_atomically(self.cert, pem(leaf.cert_chain_pems))
        self.ca = ca

    def args(self) -> List[Any]:
        return ["--tls-cert", self.cert, "--tls-key", self.key]


def tls_flight_client(uri: str, ca=None, client_cert=None) -> flight.FlightClient:
    kwargs: Dict[str, Any] = {"generic_options": OWN_CONNECTIONS}
    if ca is not None:
        kwargs["tls_root_certs"] = ca.cert_pem.bytes()
    if client_cert is not None:
        kwargs["cert_chain"] = pem(client_cert.cert_chain_pems)
        kwargs["private_key"] = client_cert.private_key_pem.bytes()
    return flight.FlightClient(uri, **kwargs)


def tls_db_kwargs(caller: Caller, ca=None, client_cert=None) -> Dict[str, str]:
    kwargs = caller.db_kwargs()
    if ca is not None:
        kwargs[TLS_ROOT_CERTS] = ca.cert_pem.bytes().decode()
    if client_cert is not None:
        kwargs[MTLS_CERT_CHAIN] = pem(client_cert.cert_chain_pems).decode()
        kwargs[MTLS_PRIVATE_KEY] = client_cert.private_key_pem.bytes().decode()
    return kwargs


def flight_reads(uri: str, creds: Credentials, expected: CatalogState, what: str,
                 **client) -> None:
    """A reader logs in (Basic) over `uri` and reads the whole catalog through Flight."""
    with tls_flight_client(uri, **client) as c:
        opts = options(creds.caller("reader", "password").headers(c))
        assert_state(flight_state(c, uri, opts), expected, what)


def adbc_reads(uri: str, creds: Credentials, expected: CatalogState, what: str,
               **client) -> None:
    with adbc(uri, tls_db_kwargs(creds.caller("reader", "password"), **client)) as conn:
        assert_state(adbc_state(conn), expected, what)


def flight_cannot_connect(uri: str, creds: Credentials, what: str, **client) -> None:
    """A call fails as UNAVAILABLE: the connection never got past TLS."""
    with tls_flight_client(uri, **client) as c:
        with pytest.raises(flight.FlightUnavailableError) as e:
            list(c.list_flights(options=options([bearer(creds.tokens["reader-token"])])))
    assert "UNAVAILABLE" in str(e.value) or "unavailable" in str(e.value), f"{what}: {e.value}"


def adbc_cannot_connect(uri: str, creds: Credentials, what: str, words: Sequence[str],
                        **client) -> None:
    """The connection fails as UNAVAILABLE, saying `words`. (Only a failure the client finds
    itself has stable words: when the server ends the handshake, as for a missing client
    certificate, the driver reports whichever of the alert, EOF or a broken pipe it met
    first.)"""
    with pytest.raises(flightsql.Error) as e:
        with adbc(uri, tls_db_kwargs(creds.caller("reader", "password"), **client)) as conn:
            scalar(conn, "SELECT 1")
    msg = str(e.value)
    assert "(Unavailable;" in msg, f"{what}: not UNAVAILABLE: {msg}"
    for w in words:
        assert w in msg, f"{what}: the message does not say {w!r}: {msg}"


def assert_serving(running: Running, what: str) -> None:
    assert running.server.proc.poll() is None, \
        f"{what}: the server exited {running.server.proc.returncode}"
    assert "panicked" not in running.server.log(), f"{what}: the server panicked"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    trustme = pytest.importorskip("trustme")
    root = tmp_path_factory.mktemp("pki")
    ca, other = trustme.CA(), trustme.CA()
    return {
        "ca": ca,
        "other_ca": other,
        "server": ServerCert.issue(ca, root / "server"),
        "client": ca.issue_cert("client@example"),
        "stranger": other.issue_cert("client@example"),
        "client_ca": _written(root / "client-ca.pem", ca.cert_pem.bytes()),
    }


def _written(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.fixture(scope="module")
def tls_server(server_factory, creds, pki) -> Running:
    return server_factory("auth-tls",
                          extra_args=["--auth-file", creds.file, *pki["server"].args()])


@pytest.fixture(scope="module")
def mtls_server(server_factory, creds, pki) -> Running:
    return server_factory("auth-mtls", extra_args=[
        "--auth-file", creds.file, *pki["server"].args(), "--tls-client-ca", pki["client_ca"]])


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_tls_reads_through_both_clients(tls_server, creds, expected, pki, host):
    uri = tls_uri(tls_server, host)
    flight_reads(uri, creds, expected, f"pyarrow over {uri}", ca=pki["ca"])
    adbc_reads(uri, creds, expected, f"ADBC over {uri}", ca=pki["ca"])
    # Credentials are still needed over TLS.
    with tls_flight_client(uri, ca=pki["ca"]) as c:
        with pytest.raises(pa.ArrowException) as e:
            list(c.list_flights(options=options()))
        assert_flight_unauthenticated(e.value, NO_CREDENTIALS)


def test_plaintext_and_untrusting_clients_fail_cleanly_against_tls(tls_server, creds,
                                                                   expected, pki):
    plain = tls_server.uri  # grpc://: no TLS
    secure = tls_uri(tls_server)
    for _ in range(3):
        flight_cannot_connect(plain, creds, "pyarrow in plaintext")
        adbc_cannot_connect(plain, creds, "ADBC in plaintext", [])
        flight_cannot_connect(secure, creds, "pyarrow trusting another CA", ca=pki["other_ca"])
        adbc_cannot_connect(secure, creds, "ADBC trusting another CA",
                            ["certificate signed by unknown authority"], ca=pki["other_ca"])
        # Trusting only the system's CAs.
        flight_cannot_connect(secure, creds, "pyarrow trusting the system CAs")
        assert_serving(tls_server, "after the failed handshakes")
    # The server goes on for clients that do it right.
    flight_reads(secure, creds, expected, "pyarrow after the failed clients", ca=pki["ca"])
    adbc_reads(secure, creds, expected, "ADBC after the failed clients", ca=pki["ca"])


def test_mutual_tls_needs_a_client_certificate_from_the_ca(mtls_server, creds, expected, pki):
    uri = tls_uri(mtls_server)
    flight_cannot_connect(uri, creds, "pyarrow without a client certificate", ca=pki["ca"])
    adbc_cannot_connect(uri, creds, "ADBC without a client certificate", [], ca=pki["ca"])
    flight_cannot_connect(uri, creds, "pyarrow with a certificate from another CA",
                          ca=pki["ca"], client_cert=pki["stranger"])
    adbc_cannot_connect(uri, creds, "ADBC with a certificate from another CA", [],
                        ca=pki["ca"], client_cert=pki["stranger"])
    flight_cannot_connect(mtls_server.uri, creds, "pyarrow in plaintext")
    assert_serving(mtls_server, "after the refused clients")
    flight_reads(uri, creds, expected, "pyarrow with the CA's client certificate",
                 ca=pki["ca"], client_cert=pki["client"])
    adbc_reads(uri, creds, expected, "ADBC with the CA's client certificate",
               ca=pki["ca"], client_cert=pki["client"])
    # A client certificate is no login: credentials are still needed.
    with tls_flight_client(uri, ca=pki["ca"], client_cert=pki["client"]) as c:
        with pytest.raises(pa.ArrowException) as e:
            list(c.list_flights(options=options()))
        assert_flight_unauthenticated(e.value, NO_CREDENTIALS)


def test_certificates_reload_on_sighup(server_factory, creds, expected, tmp_path):
    trustme = pytest.importorskip("trustme")
    first, second = trustme.CA(), trustme.CA()
    cert = ServerCert.issue(first, tmp_path / "server")
    running = server_factory("auth-tls-reload",
                             extra_args=["--auth-file", creds.file, *cert.args()])
    uri = tls_uri(running)
    flight_reads(uri, creds, expected, "trusting the first CA", ca=first)
    flight_cannot_connect(uri, creds, "trusting the second CA, before the swap", ca=second)

    cert.reissue(second)
    line = reload(running.server)
    flight_reads(uri, creds, expected, "trusting the second CA, after the reload", ca=second)
    adbc_reads(uri, creds, expected, "ADBC trusting the second CA, after the reload", ca=second)
    flight_cannot_connect(uri, creds, "trusting only the first CA, after the reload", ca=first)
    adbc_cannot_connect(uri, creds, "ADBC trusting only the first CA, after the reload",
                        ["certificate signed by unknown authority"], ca=first)

    # A reload that cannot read the certificate keeps the one in force.
    write_atomically(cert.cert, b"-----BEGIN CERTIFICATE-----\nnot a certificate\n")
    mark = running.server.line_count
    running.server.proc.send_signal(signal.SIGHUP)
    failed = running.server.wait_for_line("reload failed", since=mark,
                                          timeout=RELOAD_TIMEOUT_S)
    assert failed is not None, (
        f"no `reload failed` line after SIGHUP with a broken certificate; output since "
        f"({line!r} before):\n{running.server.log(since=mark)}")
    assert_serving(running, "after a SIGHUP with a broken certificate")
    assert str(cert.cert) in failed, failed
    flight_reads(uri, creds, expected, "trusting the second CA, after the failed reload",
                 ca=second)


# --------------------------------------------------------------------------------------------
# Sessions: what one creates is its own; how many there may be.


def assert_not_found(err: BaseException, what: str) -> None:
    msg = str(err)
    assert "NOT_FOUND" in msg or "not found" in msg.lower(), f"{what}: not NOT_FOUND: {err!r}"


def test_transactions_and_prepared_statements_belong_to_their_session(writable, creds, ids):
    """Another session, even the same user's or an admin's, cannot commit, use or close what
    a session opened: to it they do not exist. The owner still can."""
    uri = writable.uri
    before = committed_state(uri, creds)
    row = data_file(ids.file(), ids.table(), None)
    insert = f"INSERT INTO ducklake_data_file VALUES ({', '.join(map(sql_value, row))})"
    query = "SELECT count(*) AS n FROM ducklake_data_file"
    with flight.FlightClient(uri) as client:
        owner = options(creds.caller("writer", "password").headers(client))
        others = {
            "the same user's other session": options(
                creds.caller("writer", "password").headers(client)),
            "an admin": options(creds.caller("admin", "token").headers(client)),
        }
        txn = begin_transaction(client, owner)
        statement_update(client, insert, owner, txn)
        (created,) = action(client, "CreatePreparedStatement", _bytes_field(1, query.encode()),
                            owner)
        handle = proto_fields(proto_fields(created)[2])[1]
        prepared = command("CommandPreparedStatementQuery", _bytes_field(1, handle))
        for who, opts in others.items():
            for what, call in [
                ("a statement in the transaction", lambda: statement_update(client, insert, opts, txn)),
                ("committing the transaction", lambda: end_transaction(client, opts, txn,
                                                                       END_COMMIT)),
                ("running the prepared statement",
                 lambda: client.get_flight_info(prepared, opts)),
                ("closing the prepared statement", lambda: action(
                    client, "ClosePreparedStatement", _bytes_field(1, handle), opts)),
            ]:
                with pytest.raises(pa.ArrowException) as e:
                    call()
                assert_not_found(e.value, f"{what} by {who}")
        assert_state(committed_state(uri, creds), before, "after the other sessions' tries")
        # The owner's are intact. Its untagged query runs in its open transaction, so it
        # sees the row staged there.
        info = client.get_flight_info(prepared, owner)
        assert read_info(client, uri, info, owner).column("n").to_pylist() == \
            [len(before[DATA_FILE]) + 1]
        end_transaction(client, owner, txn, END_COMMIT)
    assert_state(committed_state(uri, creds), before.with_rows(DATA_FILE, [row]),
                 "after the owner's commit")


def test_sessions_are_capped_and_a_closed_session_makes_room(server_factory, creds):
    running = server_factory("auth-sessions", steps_file=None,
                             extra_args=["--auth-file", creds.file, "--max-sessions", "2"])
    with flight.FlightClient(running.uri) as client:
        first = options(creds.caller("reader", "password").headers(client))
        second = options(creds.caller("writer", "token").headers(client))
        list(client.list_flights(options=second))  # a token's session opens at its first call
        for caller in (creds.caller("admin", "password"), creds.caller("admin", "token")):
            with pytest.raises(pa.ArrowException) as e:
                list(client.list_flights(options=options(caller.headers(client))))
            msg = str(e.value)
            assert "RESOURCE_EXHAUSTED" in msg or "resource exhausted" in msg, repr(e.value)
            assert "--max-sessions" in msg, msg
        # The open sessions go on.
        list(client.list_flights(options=first))
        list(client.list_flights(options=second))
        # CloseSession ends the reader's session; its token is refused from then on.
        list(client.do_action(flight.Action("CloseSession", b""), first))
        with pytest.raises(pa.ArrowException) as e:
            list(client.list_flights(options=first))
        assert_flight_unauthenticated(e.value, UNKNOWN_TOKEN)
        third = options(creds.caller("admin", "password").headers(client))
        list(client.list_flights(options=third))


# --------------------------------------------------------------------------------------------
# Listening beyond loopback.


@contextlib.contextmanager
def listening_anywhere(tmp_path: Path, name: str, extra: Sequence[Any]) -> Iterator[
        Tuple[str, Callable[[], str]]]:
    """`moraine serve --listen 0.0.0.0:0 EXTRA` on an empty store: (its address, its output
    so far) once it listens; stopped afterwards, and it must stop cleanly."""
    log = tmp_path / f"{name}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(moraine_bin()), "serve", "--listen", "0.0.0.0:0", "--data",
             str(tmp_path / name), *map(str, extra)],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=_child_env())
    output = lambda: log.read_text(errors="replace")  # noqa: E731
    try:
        deadline = time.monotonic() + 60
        while (m := re.search(r"listening on (\S+)", output())) is None:
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"{name}: did not start listening:\n{output()}", pytrace=False)
            time.sleep(0.05)
        yield m.group(1), output
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
    assert proc.returncode in (0, -signal.SIGTERM), f"{name}: exited {proc.returncode} on SIGTERM"


def test_beyond_loopback_the_server_needs_credentials_or_insecure_no_auth(tmp_path, creds):
    data = tmp_path / "refused"
    done = subprocess.run([str(moraine_bin()), "serve", "--listen", "0.0.0.0:0", "--data",
                           str(data)], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL, env=_child_env())
    out = done.stdout + done.stderr
    assert done.returncode != 0, f"served on 0.0.0.0 without credentials:\n{out}"
    for w in ("0.0.0.0", "--auth-file", "--insecure-no-auth"):
        assert w in out, f"the refusal does not say {w!r}:\n{out}"
    assert "listening on" not in out, out

    for name, extra, warned in [
        ("anywhere-insecure", ["--insecure-no-auth"], True),
        ("anywhere-secured", ["--auth-file", creds.file], False),
    ]:
        with listening_anywhere(tmp_path, name, extra) as (address, output):
            assert address.startswith("0.0.0.0:"), address
            assert ("--insecure-no-auth" in output()) == warned, output()
