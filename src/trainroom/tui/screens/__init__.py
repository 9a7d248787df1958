"""The control room's modal screens: confirmation, result, help, run picker."""
