"""Sphinx configuration of hpctrain's documentation (built by scripts/docs.sh, warnings as
errors). Pages are MyST Markdown; docs/reference/{config,cli,exit-status}.md are generated from the
code by `python -m hpctrain.docgen docs/reference`."""

import sys
from pathlib import Path

from hpctrain import __version__

sys.path.insert(0, str(Path(__file__).parent / "_ext"))

project = "hpctrain"
author = "the hpctrain developers"
copyright = "2026, the hpctrain developers"
version = release = __version__

# sitecheck: the built site's checks (a dash where an option's `--` belongs, an undocumented
# public name of the API reference), warnings and so errors of the build
extensions = ["myst_parser", "sphinx.ext.autodoc", "sitecheck"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "_scratch", "_generated"]
# `[text](#a-heading)` and `[text](page.md#a-heading)` resolve to headings down to level 3, and a
# link to a missing page or anchor is a warning, so an error of the build
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist", "attrs_inline"]
suppress_warnings: list[str] = []
nitpicky = True
# Smart quotes would print `--estimate` as "–estimate" outside code: a copied command breaks
smartquotes = False

# the API reference (reference/api.md): signatures as written, types in the description. A type
# the page does not document (torch's, the standard library's, hpctrain's Config or Layout, names
# imported for type checking only) is named without a link: no inventory is fetched, the build
# runs offline. Every other reference (pages, anchors, documented names) must resolve.
autodoc_typehints = "description"
autodoc_typehints_format = "short"
autodoc_member_order = "bysource"
autodoc_class_signature = "separated"
nitpick_ignore_regex = [(r"py:(class|obj|data)", r".*")]

html_theme = "furo"
html_title = f"hpctrain {release}"
html_static_path: list[str] = []
html_copy_source = False
html_show_sourcelink = False
pygments_style = "friendly"
# hpctrain's terminal tables are up to 96 columns wide and drawn with box characters: a smaller
# code font fits them in the content column, and DejaVu Sans Mono (where installed) has the heavy
# box characters that some systems' first monospace font lacks
_mono = '"DejaVu Sans Mono", SFMono-Regular, Menlo, Consolas, Monaco, "Liberation Mono", monospace'
html_theme_options = {
    "light_css_variables": {"font-stack--monospace": _mono, "code-font-size": "0.74em"},
    "dark_css_variables": {"font-stack--monospace": _mono, "code-font-size": "0.74em"},
}
