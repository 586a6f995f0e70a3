from kiro.fastread import entry

entry()
