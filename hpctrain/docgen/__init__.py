"""The documentation's reference pages, generated from the code so that they cannot drift from it:
every config key from the typed schema and conf/ (config_ref.py), every command and option from
the argparse parser (cli_ref.py), the exit statuses from the typed errors (exits_ref.py).
`python -m hpctrain.docgen docs/reference` writes them; `--check` fails on any difference
(scripts/docs.sh, and the quick tier's tests/docs)."""
