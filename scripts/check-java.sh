#!/usr/bin/env sh
# Spark 4 needs Java 17 or 21: JAVA_HOME when set, else the java on the PATH.
if [ -n "${JAVA_HOME:-}" ]; then java="$JAVA_HOME/bin/java"; else java="$(command -v java || true)"; fi
how="Install one: on Debian/Ubuntu 'sudo apt-get install openjdk-17-jre-headless', on macOS 'brew install openjdk@17', or set JAVA_HOME to a Java 17 or 21."
if [ -z "$java" ] || [ ! -x "$java" ]; then
  if [ -n "${JAVA_HOME:-}" ]; then where="JAVA_HOME=$JAVA_HOME has no bin/java"; else where="JAVA_HOME is unset and no java is on the PATH"; fi
  echo "Tidemark needs Java 17 or 21 for Spark, and none was found ($where). $how" >&2
  exit 1
fi
version=$("$java" -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n 1)
case "$version" in
  17|21) exit 0 ;;
  *) echo "Tidemark needs Java 17 or 21 for Spark; $java is Java ${version:-of unknown version}. $how" >&2; exit 1 ;;
esac
