"""${message}

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}
Create Date: ${create_date}
"""

from __future__ import annotations

from alembic import context, op
import sqlalchemy as sa
${imports if imports else ""}

revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}
branch_labels = ${repr(branch_labels)}
depends_on = ${repr(depends_on)}


def upgrade() -> None:
    prefix = context.config.attributes.get("table_prefix", "")
    ${upgrades if upgrades else "pass"}


def downgrade() -> None:
    prefix = context.config.attributes.get("table_prefix", "")
    ${downgrades if downgrades else "pass"}
