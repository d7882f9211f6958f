"""Reading the response heads llhttp refuses but curl and browsers read (RFC 9112).

:mod:`swarmget.protocol.http11` gives every head to llhttp as it came, strictly;
only a head that llhttp refuses comes here, to be rewritten into the plain form
llhttp accepts, and is then parsed once more.  So a well-formed head costs
nothing extra, and what we accept beyond llhttp's strict rules is exactly the
list below, each a recipient's liberty granted by RFC 9112 and taken by curl:

* **Bare LF line ends** (section 2.2: a recipient MAY recognize a single LF as a
  line terminator and ignore any preceding CR): lines are split at LF, the CRs
  before it are dropped (``CR CR LF`` is how a Windows text-mode CGI writes
  CRLF; curl reads it), and the head is rewritten with CRLF.  Any other CR
  stays where it was, so llhttp still refuses a bare CR inside a line.
* **Whitespace-led lines right after the status line** (section 2.2: a
  recipient MUST either reject the message or ignore each such line): ignored,
  unless one names Transfer-Encoding or Content-Length: then refused, as curl
  refuses them all (ignored, it would save the framing as the file).
* **Obsolete line folding** (section 5.2: a user agent MUST replace each obs-fold
  with one or more SP before interpreting the value): each continuation line
  is joined to the field before it with one space.
* **A repeated Content-Length** (RFC 9110 section 8.6: a list of identical
  values, ``42, 42``, or several identical fields, MAY be taken as one): merged
  into one field; differing or non-numeric values are a :class:`ProtocolError`.
* **An empty Transfer-Encoding** (RFC 9110 section 5.6.1: a list of no
  element, as ``Transfer-Encoding: ,`` is, which llhttp reads): dropped, so the
  body runs to the close as curl reads it; beside a Content-Length, refused
  (see :func:`_drop_empty_codings`).
* **Fields no one could mean**: a name that is not a token (a space, a quote
  or UTF-8 in it), or whitespace between the name and its colon (section 5.1
  has a server refuse it and a proxy remove it): the field is dropped, as curl
  ignores it (``Content-Length : 5`` does not frame the body for curl either).
* **Control characters in a value** (RFC 9110 section 5.5 lets a recipient
  keep them; llhttp refuses them): each C0 control other than tab, CR and NUL,
  and DEL, becomes a space; but not in the fields we act on (``_ACTED_ON``:
  framing, Location, validators), which stay refused as curl refuses a
  Location with a control character in it.
* **A status line as curl reads it** (RFC 9112 section 4 names ``HTTP`` and
  one SP): the name in any case, any blanks (tabs, several spaces) between
  the version and the code or around the reason phrase: rewritten as
  ``HTTP/1.x SP code SP reason``.  A textual ``HTTP/2`` or ``HTTP/2.0``
  version, in reply to our HTTP/1.1 request, is read as HTTP/1.0 (see
  :func:`_status_line`).  The three digits must still be followed by a blank
  or the end of the line.

Nothing here makes llhttp accept a NUL or a bare CR anywhere in a field, a line
without a colon or a bad status line (curl refuses a NUL too): those stay in
the rewritten head and llhttp refuses them.
"""

from __future__ import annotations

import re
from typing import Final

from swarmget.errors import ProtocolError

_FOLD: Final = (b" ", b"\t")
_TOKEN: Final = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # RFC 9110 section 5.6.2
# C0 controls but NUL, tab and CR, and DEL: a space each (see the module docstring).
_CONTROLS: Final = bytes([*range(1, 9), *range(10, 13), *range(14, 32), 127])
_CONTROLS_TO_SPACE: Final = bytes.maketrans(_CONTROLS, b" " * len(_CONTROLS))
# Fields whose values we act on: a control character there is not read as a space.
_ACTED_ON: Final = frozenset(
    {
        b"content-length",
        b"transfer-encoding",
        b"content-encoding",
        b"content-range",
        b"location",
        b"etag",
        b"last-modified",
        b"retry-after",
        b"connection",
        b"date",
    }
)
_CONTENT_LENGTH: Final = b"content-length"
_TRANSFER_ENCODING: Final = b"transfer-encoding"
# RFC 9110 section 8.6 leaves the limit to us; past 2**63 - 1 no file is real.
MAX_CONTENT_LENGTH: Final = (1 << 63) - 1


def repair(block: bytes | bytearray) -> bytes:
    """``block`` (a whole head, up to its blank line) rewritten for llhttp.

    Raises :class:`ProtocolError` for Content-Length values that conflict.
    """
    lines = bytes(block).split(b"\n")[:-1]  # the last piece is after the blank line's LF
    lines = [line.rstrip(b"\r") for line in lines]
    fields = [_field(line) for line in _unfold(lines[1:-1])]  # no status line, no blank line
    status = _status_line(lines[0])
    kept = _drop_empty_codings([field for field in fields if field is not None])
    return b"\r\n".join([status, *_merge_content_length(kept), b"", b""])


def _field(line: bytes) -> bytes | None:
    """``line`` as a field llhttp reads, None to drop it (see the module docstring)."""
    name, colon, value = line.partition(b":")
    if not colon or b"\0" in line or b"\r" in line:
        return line  # not a field at all, or a NUL or CR in it: llhttp refuses it
    if not _TOKEN.fullmatch(name):
        return None
    if name.lower() in _ACTED_ON:
        return line
    return name + b":" + value.translate(_CONTROLS_TO_SPACE)


# What curl 7.88 reads as a status line: the name in any case, blanks after the
# version, three digits, then a blank or the end.  ``200OK`` and ``2000`` do not.
_STATUS: Final = re.compile(rb"(?i:HTTP)/(1\.[01]|2(?:\.0)?)[ \t]+([0-9]{3})(?:[ \t](.*))?")


def _status_line(line: bytes) -> bytes:
    """``HTTP/1.x SP code [SP reason]`` from a status line curl reads.

    curl takes the name in any case (``http/1.1``), any blanks (spaces or
    tabs) after the version, and anything after the three digits; we take a
    blank or nothing there (``200OK`` or ``2000`` stay refused).  A head that
    calls itself ``HTTP/2`` or ``HTTP/2.0`` in reply to our HTTP/1.1 request (a
    proxy passing its own protocol's name on; the binary HTTP/2 is refused
    before this), or whose name is not in capitals, is read as HTTP/1.0 (curl
    does so), whose connections are not kept alive unless asked: what else it
    got wrong is not bet on.  Anything else is left for llhttp to refuse.
    """
    match = _STATUS.fullmatch(line)
    if match is None:
        return line
    number, code, reason = match.groups()
    # HTTP/1.0 for a name in another case too, as curl reads it.
    plain = line.startswith(b"HTTP/") and number.startswith(b"1")
    version = b"HTTP/" + (number if plain else b"1.0")
    reason = (reason or b"").strip(b" \t")
    return version + b" " + code + (b" " + reason if reason else b"")


# A line that names a field which frames the body, whatever its case or blanks.
_FRAMING_LINE: Final = re.compile(rb"[ \t]*(transfer-encoding|content-length)[ \t]*:", re.I)


def _unfold(lines: list[bytes]) -> list[bytes]:
    """Fields with obs-fold undone and whitespace-led lines before the first dropped."""
    fields: list[list[bytes]] = []  # each field's pieces, joined once at the end:
    for line in lines:  # a head of 70,000 folded lines must not cost quadratic time
        if line[:1] not in _FOLD:
            fields.append([line])
        elif fields:
            # RFC 9112 section 5.2: replace the obs-fold with SP.
            pieces = fields[-1]
            pieces[-1] = pieces[-1].rstrip(b" \t")
            pieces.append(line.strip(b" \t"))
        elif _FRAMING_LINE.match(line):
            # Whitespace before the first field, ignored (RFC 9112 section 2.2)...
            # unless it frames the body: ignoring ``Transfer-Encoding: chunked``
            # would save the chunk framing (or a gzip stream) as the file.  The
            # RFC's other choice, and curl's: refuse the message.
            raise ProtocolError(f"whitespace before the first field {line.strip()[:40]!r}")
    return [b" ".join(pieces) for pieces in fields]


def _drop_empty_codings(fields: list[bytes]) -> list[bytes]:
    """``fields`` without the Transfer-Encoding fields that name no coding.

    An empty list (RFC 9110 5.6.1), as ``Transfer-Encoding: ,`` is, which
    llhttp reads; a blank value it refuses, where curl reads the body to the
    close (or by another Transfer-Encoding field).  So do we.  Beside a
    Content-Length it stays refused: curl reads to the close, and we read
    ``identity`` by the length (RFC 2616): which would the server mean?
    """
    empty = [
        i
        for i, field in enumerate(fields)
        if _name(field) == _TRANSFER_ENCODING and not field.partition(b":")[2].strip(b" \t")
    ]
    if not empty:
        return fields
    names = [_name(field) for field in fields]
    if _CONTENT_LENGTH in names and names.count(_TRANSFER_ENCODING) == len(empty):
        raise ProtocolError("empty Transfer-Encoding with a Content-Length")
    return [field for i, field in enumerate(fields) if i not in empty]


def _merge_content_length(fields: list[bytes]) -> list[bytes]:
    """``fields`` with every Content-Length folded into one, or unchanged if single."""
    positions = [i for i, field in enumerate(fields) if _name(field) == _CONTENT_LENGTH]
    if not positions:
        return fields
    values = [fields[i].partition(b":")[2] for i in positions]
    if len(values) == 1 and b"," not in values[0]:
        return fields  # llhttp judges a single value itself
    length = content_length(values)
    merged = [field for i, field in enumerate(fields) if i not in positions[1:]]
    merged[positions[0]] = b"Content-Length: %d" % length
    return merged


def content_length(values: list[bytes]) -> int:
    """The one length all ``values`` (each a comma list) agree on, else ProtocolError."""
    lengths = set()
    for value in values:
        for item in value.split(b","):
            item = item.strip(b" \t")
            if not item:
                continue  # RFC 9110 section 5.6.1: empty list elements do not count
            if not item.isdigit():
                raise ProtocolError(f"invalid Content-Length {value.strip()[:40]!r}")
            lengths.add(int(item))
    if len(lengths) != 1:
        shown = b", ".join(v.strip() for v in values)[:80]
        raise ProtocolError(f"conflicting Content-Length values {shown!r}")
    length = lengths.pop()
    if length > MAX_CONTENT_LENGTH:
        raise ProtocolError(f"Content-Length {length} is too large")
    return length


def _name(field: bytes) -> bytes:
    return field.partition(b":")[0].lower()


def transfer_codings(block: bytes | bytearray) -> list[bytes]:
    """Every Transfer-Encoding token of the head, in order, lower case, empty ones out."""
    codings: list[bytes] = []
    for line in bytes(block).split(b"\n")[1:]:
        name, colon, value = line.partition(b":")
        if colon and name.lower() == b"transfer-encoding":
            codings += [token for token in value.lower().replace(b"\t", b" ").split(b",")]
    return [token.strip(b" \r") for token in codings if token.strip(b" \r")]
