"""Safe YAML loading: positions, duplicate keys, tags, limits (planner.loading)."""

from __future__ import annotations

import math
import time

import pytest

from planner.errors import InputError
from planner.loading import MAX_DEPTH, MAX_FILE_BYTES, load_file, parse_text


def messages(exc: InputError) -> list[str]:
    return [f"{p.line}:{p.column}: {p.message} ({p.path})" for p in exc.problems]


def test_plain_data_and_marks():
    doc = parse_text("a: 1\nb:\n  - x\n  - {c: 2.5}\n", "f.yaml")
    assert doc.data == {"a": 1, "b": ["x", {"c": 2.5}]}
    assert doc.find_mark("$.b[1].c").line == 3
    assert doc.find_mark("$.b[1].c").column == 8  # 0-based
    assert doc.find_mark("$.a").column == 3


def test_yaml_12_core_schema():
    doc = parse_text("a: yes\nb: on\nc: 1e9\nd: 0x10\ne: '7'\nf: ~\ng: TRUE\nh: .inf\n")
    assert doc.data == {"a": "yes", "b": "on", "c": 1e9, "d": 16, "e": "7", "f": None,
                        "g": True, "h": math.inf}


def test_duplicate_key_points_at_second():
    with pytest.raises(InputError) as exc:
        parse_text("a: 1\nb: 2\na: 3\n", "f.yaml")
    assert messages(exc.value) == [
        "3:1: duplicate key 'a' (first defined at line 1); each key may appear once ($.a)"]


@pytest.mark.parametrize("tag", ["!!python/object:os.system", "!!python/name:os.system",
                                 "!custom", "!!binary", "!!set"])
def test_object_tags_rejected(tag):
    with pytest.raises(InputError) as exc:
        parse_text(f"a: {tag} x\n")
    assert "is not allowed: planner files hold plain data" in str(exc.value)


def test_standard_tags_allowed():
    assert parse_text("a: !!str 12\nb: !!int '3'\nc: !!float 2\n").data == {
        "a": "12", "b": 3, "c": 2.0}


def test_merge_keys_rejected():
    with pytest.raises(InputError) as exc:
        parse_text("a: &x {k: 1}\nb:\n  <<: *x\n")
    assert "merge keys" in str(exc.value)


def test_billion_laughs_is_bounded():
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, 10):
        prev = f"*a{i - 1}"
        lines.append(f"a{i}: &a{i} [{', '.join([prev] * 10)}]")
    t0 = time.perf_counter()
    with pytest.raises(InputError) as exc:
        parse_text("\n".join(lines) + "\n")
    assert time.perf_counter() - t0 < 2.0
    assert "expands to more than" in str(exc.value)


def test_deep_nesting_is_an_error_not_a_crash():
    text = "a: " + "[" * 10_000 + "]" * 10_000 + "\n"
    with pytest.raises(InputError) as exc:
        parse_text(text)
    assert f"nesting deeper than {MAX_DEPTH} levels" in str(exc.value)


def test_deep_block_nesting():
    text = "".join(f"{'  ' * i}k{i}:\n" for i in range(200)) + "  " * 200 + "v: 1\n"
    with pytest.raises(InputError) as exc:
        parse_text(text)
    assert "nesting deeper" in str(exc.value)


def test_syntax_error_position():
    with pytest.raises(InputError) as exc:
        parse_text("a: [1, 2\nb: 3\n", "s.yaml")
    (p,) = exc.value.problems
    assert (p.file, p.line) == ("s.yaml", 2)
    assert p.message.startswith("invalid YAML:")
    assert "started at line 1" in p.message


def test_two_documents():
    with pytest.raises(InputError) as exc:
        parse_text("a: 1\n---\nb: 2\n")
    assert "expected one YAML document" in str(exc.value)


def test_non_utf8(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_bytes(b"name: ok\nother: caf\xe9\n")
    with pytest.raises(InputError) as exc:
        load_file(f)
    (p,) = exc.value.problems
    assert (p.line, p.column) == (2, 11)
    assert "not valid UTF-8 (byte 0xe9)" in p.message


def test_binary_garbage(tmp_path):
    f = tmp_path / "bin.yaml"
    f.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(InputError) as exc:
        load_file(f)
    assert "NUL byte" in str(exc.value) or "not valid UTF-8" in str(exc.value)


def test_control_character(tmp_path):
    f = tmp_path / "ctl.yaml"
    f.write_text("a: 1\nb: x\x07y\n")
    with pytest.raises(InputError) as exc:
        load_file(f)
    (p,) = exc.value.problems
    assert (p.line, p.column) == (2, 5)
    assert "control character U+0007" in p.message


@pytest.mark.parametrize("char, said", [
    ("\u2028", "U+2028 (LINE SEPARATOR, a line break to YAML that editors do not show as one)"),
    ("\u2029", "U+2029 (PARAGRAPH SEPARATOR"),
    ("\x85", "U+0085 (NEXT LINE"),
    ("\ufeff", "U+FEFF (a byte-order mark inside the file"),
])
def test_characters_an_editor_does_not_show_are_named(tmp_path, char, said):
    """YAML reads U+2028, U+2029 and U+0085 as line breaks that editors do not show, so
    every later line number was one off; a byte-order mark inside the file was a syntax
    error (found by an audit). Each is named where it is, in the editor's lines; at the
    very start a byte-order mark is still fine."""
    f = tmp_path / "x.yaml"
    f.write_text(f"a: 1\nb: x{char}y\nc: 2\n", encoding="utf-8")
    with pytest.raises(InputError) as exc:
        load_file(f)
    (p,) = exc.value.problems
    assert (p.line, p.column) == (2, 5)
    assert f"found {said}" in p.message and p.message.endswith("; delete it")


def test_bom_is_fine(tmp_path):
    f = tmp_path / "bom.yaml"
    f.write_bytes("\ufeffa: 1\n".encode())
    assert load_file(f).data == {"a": 1}


def test_missing_directory_and_large(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        load_file(tmp_path / "nope.yaml")
    with pytest.raises(InputError, match="is a directory"):
        load_file(tmp_path)
    big = tmp_path / "big.yaml"
    with big.open("wb") as fh:
        fh.truncate(MAX_FILE_BYTES + 1)
    with pytest.raises(InputError, match="file is too large"):
        load_file(big)


def test_unreadable(tmp_path, monkeypatch):
    """A permission error reads as a message (simulated: the tests may run as root)."""
    from pathlib import Path

    f = tmp_path / "secret.yaml"
    f.write_text("a: 1\n")

    def denied(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "open", denied)
    with pytest.raises(InputError, match="cannot read the file: Permission denied"):
        load_file(f)


def test_non_string_keys_kept_as_text():
    # numbers as their value's text (bandwidth_by_group's group sizes are read back as
    # numbers); booleans as the file spells them, so a message quotes 'true', not 'True'
    assert parse_text("1: a\ntrue: b\nFalse: c\n0x10: d\n").data == {
        "1": "a", "true": "b", "False": "c", "16": "d"}


def test_collection_key_rejected():
    with pytest.raises(InputError, match="mapping keys must be plain strings"):
        parse_text("? [a, b]\n: 1\n")


def test_alias_reuses_value():
    doc = parse_text("base: &b {x: 1}\nother: *b\n")
    assert doc.data["other"] == {"x": 1}


def test_unknown_alias():
    with pytest.raises(InputError):
        parse_text("a: *nope\n")
