"""``python -m nemo_opd.tiny``: install or build the tiny assets and print their table."""

from nemo_opd.tiny.assets import main

main()
