"""The README is a landing page that cannot drift: at most 200 lines, a first section that says what SOFT is and why it
is linear in at most 15 lines and points to the benchmarks' headline table for the figures, exactly the two set-up
commands, the model zoo table read from the metafiles, and every local link of the README and of docs/ resolving to a
file (and a heading)."""
from __future__ import annotations

import re
from pathlib import Path

import yaml
from helpers.repo import ROOT

README = ROOT / 'README.md'
DOCS = sorted((ROOT / 'docs').rglob('*.md'))

MAX_LINES = 200
# The first section (everything above "## Set up"): what SOFT is and why it is linear; the figures live with their runs
FIRST_SECTION_MAX_LINES = 15
HEADLINE_TABLE = 'docs/benchmarks/README.md#headline-ratios'
# what a run result looks like in prose: a measured ratio (492×, 1.30×; not a size such as 1333×800) or a run's date
RUN_RESULT = re.compile(r'\d×(?!\s*\d)|\b\d{4}-\d{2}-\d{2}\b')
# The set-up block that .ci/run runs on a fresh clone.
SETUP_COMMANDS = ['bash tools/install.sh', 'python -m pytest -n 2 --dist loadgroup']
ZOO_HEADER = '| model | backbone | published | params (M) |'
METRIC_NAMES = {'Top 1 Accuracy': 'top-1'}  # a metafile's metric name as the zoo table writes it; others as they are

FENCE = re.compile(r'^```.*?^```', re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r'`[^`\n]*`')
LINK = re.compile(r'!?\[[^\]]*\]\(([^()\s]+)\)')
HEADING = re.compile(r'^#{1,6}\s+(.+?)\s*#*$', re.MULTILINE)


def zoo_rows() -> list[str]:
    """The README's model zoo rows, built from the metafiles that model-index.yml imports: every model with a
    published result (the demos and drop-ins have none), in the metafiles' order."""
    rows = []
    for metafile in yaml.safe_load((ROOT / 'model-index.yml').read_text())['Import']:
        for model in yaml.safe_load((ROOT / metafile).read_text())['Models']:
            if 'Results' not in model:
                continue
            published = ' / '.join(f'{METRIC_NAMES.get(name, name)} {value}'
                                   for result in model['Results'] for name, value in result['Metrics'].items())
            meta = model['Metadata']
            rows.append(f"| [{model['Name']}]({model['Config']}) | {meta['Backbone']} | {published} | "
                        f"{meta['Parameters (millions)']} |")
    return rows


def readme_zoo_rows(text: str) -> list[str]:
    """The rows of the README's table under ``ZOO_HEADER`` (after its separator line)."""
    lines = text.splitlines()
    start = lines.index(ZOO_HEADER) + 2
    rows = []
    for line in lines[start:]:
        if not line.startswith('|'):
            break
        rows.append(line)
    return rows


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped (word characters, hyphens and spaces kept),
    spaces turned into hyphens."""
    return re.sub(r'[^\w\- ]', '', heading.replace('`', '').strip().lower()).replace(' ', '-')


def anchors(path: Path) -> set[str]:
    """The anchors of a markdown file's headings (a repeated heading gets -1, -2, ... as on GitHub)."""
    found: set[str] = set()
    for heading in HEADING.findall(FENCE.sub('', path.read_text())):
        anchor, n = slug(heading), 0
        while (f'{anchor}-{n}' if n else anchor) in found:
            n += 1
        found.add(f'{anchor}-{n}' if n else anchor)
    return found


def broken_links(text: str, source: Path) -> list[str]:
    """Every local link of ``text`` (written in ``source``) whose file does not exist or whose #anchor names no
    heading of it; links in code and links to other sites are not checked."""
    broken = []
    for target in LINK.findall(INLINE_CODE.sub('', FENCE.sub('', text))):
        if re.match(r'[a-z][a-z0-9+.-]*:', target):  # https:, mailto:, ...
            continue
        path_part, _, anchor = target.partition('#')
        path = (source.parent / path_part).resolve() if path_part else source
        if not path.exists():
            broken.append(f'{target} (no such file)')
        elif anchor and path.suffix == '.md' and anchor not in anchors(path):
            broken.append(f'{target} (no heading #{anchor} in {path.relative_to(ROOT)})')
    return broken


def test_readme_is_a_landing_page_of_at_most_200_lines():
    num_lines = len(README.read_text().splitlines())
    assert num_lines <= MAX_LINES, f'README.md has {num_lines} lines; move detail to docs/ (at most {MAX_LINES})'


def first_section(text: str) -> list[str]:
    """The README's lines above its "## Set up" heading."""
    return text[:text.index('\n## Set up\n')].splitlines()


def test_readme_first_section_is_what_soft_is_in_at_most_15_lines_pointing_once_to_the_headline_table():
    lines = first_section(README.read_text())
    assert len(lines) <= FIRST_SECTION_MAX_LINES, (
        f'the README\'s first section has {len(lines)} lines; say what SOFT is and why it is linear in at most '
        f'{FIRST_SECTION_MAX_LINES} and move figures and history to docs/benchmarks/ and docs/changelog.md')
    assert sum(HEADLINE_TABLE in line for line in lines) == 1
    assert [line for line in lines if RUN_RESULT.search(line)] == []
    assert 'linear' in ' '.join(lines) and 'Nyström' in ' '.join(lines)


def test_the_run_result_pattern_finds_ratios_and_dates_but_not_sizes():
    found = [bool(RUN_RESULT.search(text)) for text in (
        '492× faster', 'is 1.30× Swin-T', '(2026-12-04)', 'a 1333×800 image', 'the m × m middle', '16.6 GiB')]
    assert found == [True, True, True, False, False, False]


def test_readme_set_up_block_holds_exactly_the_two_set_up_commands():
    text = README.read_text()
    section = text[text.index('\n## Set up\n'):]
    block = section[section.index('```bash\n') + len('```bash\n'):]
    block = block[:block.index('```')]
    commands = [line.split('#')[0].strip() for line in block.splitlines()]
    assert [c for c in commands if c] == SETUP_COMMANDS


def test_readme_zoo_table_is_read_from_the_metafiles():
    expected = zoo_rows()
    assert len(expected) == 20  # 4 RetinaNet, 4 Mask R-CNN, 2 UperNet, 10 ImageNet classifiers
    assert readme_zoo_rows(README.read_text()) == expected, (
        'the README\'s model zoo table differs from the metafiles; its rows should be:\n' + '\n'.join(expected))


def test_every_local_link_of_the_readme_and_the_docs_resolves():
    assert len(DOCS) > 10
    broken = {str(path.relative_to(ROOT)): broken_links(path.read_text(), path) for path in [README, *DOCS]}
    assert {path: links for path, links in broken.items() if links} == {}


def test_the_link_check_finds_a_missing_file_and_a_missing_heading():
    text = ('[ok](docs/get_started.md#the-demos) [gone](docs/no_such_page.md) '
            '[no heading](docs/get_started.md#no-such-heading) `[in code](nowhere.md)` [site](https://example.org)')
    assert broken_links(text, README) == [
        'docs/no_such_page.md (no such file)',
        'docs/get_started.md#no-such-heading (no heading #no-such-heading in docs/get_started.md)']
    assert slug('`mim search soft_mm`, `mim train soft_mm`') == 'mim-search-soft_mm-mim-train-soft_mm'
