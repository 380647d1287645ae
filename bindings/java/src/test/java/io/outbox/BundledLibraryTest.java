package io.outbox;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertTrue;

import java.io.ByteArrayOutputStream;
import java.io.File;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.attribute.FileTime;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.stream.Collectors;
import java.util.stream.Stream;
import org.junit.Assume;
import org.junit.Test;

/**
 * The one-artifact jar (run-tests.sh builds it with build.sh --native): the library carried in
 * the jar is extracted once, checked by hash, and loaded when no path is given; an explicit path
 * still wins; a tampered extracted file is replaced, never loaded.
 */
public class BundledLibraryTest {
    private static String bundledJar() {
        String jar = System.getProperty("outbox.test.bundled.jar");
        Assume.assumeTrue("no bundled jar (run through run-tests.sh)", jar != null && Files.isRegularFile(Paths.get(jar)));
        return jar;
    }

    private static String run(Path nativeDir, String... props) throws Exception {
        List<String> cmd = new ArrayList<>();
        cmd.add(Paths.get(System.getProperty("java.home"), "bin", "java").toString());
        cmd.add("-Djava.library.path=/nonexistent");
        cmd.add("-D" + Native.NATIVE_DIR_PROPERTY + "=" + nativeDir);
        cmd.addAll(Arrays.asList(props));
        cmd.add("-jar");
        cmd.add(bundledJar());
        ProcessBuilder pb = new ProcessBuilder(cmd).redirectErrorStream(true);
        pb.environment().remove("OUTBOX_LIBRARY_PATH");
        Process proc = pb.start();
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        try (InputStream in = proc.getInputStream()) {
            in.transferTo(out);
        }
        assertTrue("child JVM finished", proc.waitFor(60, TimeUnit.SECONDS));
        String output = out.toString(StandardCharsets.UTF_8);
        assertEquals(output, 0, proc.exitValue());
        return output;
    }

    private static List<Path> extracted(Path dir) throws Exception {
        try (Stream<Path> s = Files.list(dir)) {
            return s.filter(p -> p.getFileName().toString().endsWith(".so")).collect(Collectors.toList());
        }
    }

    @Test
    public void the_jar_alone_loads_its_library_extracted_once() throws Exception {
        bundledJar();
        Path dir = Files.createTempDirectory("outbox-native-test");
        try {
            String first = run(dir);
            assertTrue(first, first.contains("loaded from " + dir));
            assertTrue(first, first.contains("extracted from /io/outbox/native/" + Native.platform() + "/liboutbox.so"));
            List<Path> files = extracted(dir);
            assertEquals(files.toString(), 1, files.size());
            FileTime t = Files.getLastModifiedTime(files.get(0));
            Files.setLastModifiedTime(files.get(0), FileTime.fromMillis(t.toMillis() - 60_000));
            FileTime aged = Files.getLastModifiedTime(files.get(0));

            String second = run(dir);
            assertTrue(second, second.contains("loaded from " + dir));
            assertEquals("reused, not extracted again", aged, Files.getLastModifiedTime(files.get(0)));

            // A file that does not match the jar's hash is replaced before anything loads it.
            Files.write(files.get(0), "not a library".getBytes(StandardCharsets.UTF_8));
            String third = run(dir);
            assertTrue(third, third.contains("loaded from " + dir));
            assertTrue(Files.size(files.get(0)) > 1_000_000);
        } finally {
            try (Stream<Path> s = Files.walk(dir)) {
                s.sorted((a, b) -> b.compareTo(a)).map(Path::toFile).forEach(File::delete);
            }
        }
    }

    @Test
    public void an_explicit_path_still_wins_over_the_bundled_library() throws Exception {
        bundledJar();
        Path dir = Files.createTempDirectory("outbox-native-test");
        try {
            String libDir = System.getProperty("java.library.path").split(File.pathSeparator)[0];
            String out = run(dir, "-D" + Native.PATH_PROPERTY + "=" + libDir);
            assertTrue(out, out.contains("loaded from " + Paths.get(libDir, System.mapLibraryName("outbox")).toAbsolutePath().normalize()));
            assertTrue("nothing extracted", extracted(dir).isEmpty());
        } finally {
            try (Stream<Path> s = Files.walk(dir)) {
                s.sorted((a, b) -> b.compareTo(a)).map(Path::toFile).forEach(File::delete);
            }
        }
    }
}
