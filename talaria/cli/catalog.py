"""``talaria catalog``: list what the catalog knows."""

from __future__ import annotations

from talaria.cli.common import CatalogOpt, catalog_of, stdout


def catalog(catalog_dirs: CatalogOpt = None) -> None:
    """List the models, servers and efficiency profiles the catalog knows."""
    cat = catalog_of(catalog_dirs)
    out = stdout()
    for m in cat.models.values():
        out.print(
            f"model  {m.name:28} {m.total_params / 1e9:6.0f}B total {m.active_params / 1e9:5.0f}B"
            f" active  {m.weight_bytes / 1e9:6.0f} GB  KV {m.kv_bytes_per_token_tp8:,} B/token "
            f"(TP8)  ctx {m.context_window_tokens:,}"
        )
    for s in cat.servers.values():
        out.print(f"server {s.name:28} {s.gpus}×{s.hbm_bytes_per_gpu / 1e9:.0f} GB HBM")
    for p in cat.profiles.values():
        out.print(f"profile {p.name}")
