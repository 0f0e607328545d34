import configparser
import re
import subprocess
import sys
from pathlib import Path

import labserve
from labserve.cli import main
from labserve.testing import nbval_sanitizer_path


def test_the_path_is_the_shipped_file():
    path = nbval_sanitizer_path()
    assert path == Path(labserve.__file__).resolve().parent / "nbval_sanitize.cfg"
    assert path.is_file()


def test_every_section_is_a_regex_and_its_replacement():
    parser = configparser.ConfigParser()
    parser.read(nbval_sanitizer_path())
    assert parser.sections()
    for name in parser.sections():
        section = parser[name]
        assert set(section) == {"regex", "replace"}, name
        re.compile(section["regex"])


def test_it_hides_ports_and_tokens():
    parser = configparser.ConfigParser()
    parser.read(nbval_sanitizer_path())
    text = "serving at http://127.0.0.1:43117/?token=a1B2_c-3"
    for name in parser.sections():
        text = re.sub(parser[name]["regex"], parser[name]["replace"], text)
    assert text == "serving at http://127.0.0.1:PORT/?token=TOKEN"


def test_cli_prints_the_path(capsys):
    assert main(["sanitizer-path"]) == 0
    assert capsys.readouterr().out == f"{nbval_sanitizer_path()}\n"


def test_the_one_liner_works_from_a_shell(tmp_path):
    # The README's form: the path comes from the installed console script.
    bin_dir = Path(sys.executable).parent
    out = subprocess.run(
        ["sh", "-c", f'test -f "$("{bin_dir}/labserve" sanitizer-path)" && echo found'],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert out.stdout == "found\n"
