package io.outbox;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertNotEquals;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import java.io.ByteArrayOutputStream;
import java.io.File;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.junit.Test;

/** Loading the native library, and the JNI boundary itself. */
public class LibraryTest {
    @Test
    public void version_and_features_come_from_the_library() {
        assertTrue(Outbox.version(), Outbox.version().matches("\\d+\\.\\d+\\.\\d+.*"));
        assertTrue(Outbox.features().contains("jni"));
        assertEquals(Native.ABI_VERSION, Native.abiVersion());
    }

    @Test
    public void explicit_path_that_does_not_exist_is_named_in_the_error() {
        OutboxLibraryException e = assertThrows(OutboxLibraryException.class,
                () -> Outbox.loadLibrary(Paths.get("/nonexistent/outbox-lib/liboutbox.so")));
        assertTrue(e.getMessage(), e.getMessage().contains("/nonexistent/outbox-lib/liboutbox.so"));
    }

    @Test
    public void missing_library_in_a_fresh_jvm_names_where_it_looked() throws Exception {
        // java.library.path pointing nowhere, no outbox.library.path: the error lists the search path.
        Run r = java("-Djava.library.path=/nonexistent/libdir-a:/nonexistent/libdir-b");
        assertEquals(r.output, 2, r.exit);
        assertTrue(r.output, r.output.contains("java.library.path"));
        assertTrue(r.output, r.output.contains("/nonexistent/libdir-a"));
        assertTrue(r.output, r.output.contains("liboutbox.so"));

        Run p = java("-Doutbox.library.path=/nonexistent/explicit");
        assertEquals(p.output, 2, p.exit);
        assertTrue(p.output, p.output.contains("no outbox native library at /nonexistent/explicit"));
        assertTrue(p.output, p.output.contains("outbox.library.path"));
    }

    @Test
    public void library_found_through_the_system_property_in_a_fresh_jvm() throws Exception {
        String loaded = Outbox.libraryLocation();
        String dir = System.getProperty("java.library.path").split(File.pathSeparator)[0];
        Run r = java("-Doutbox.library.path=" + dir, "-Djava.library.path=/nonexistent");
        assertEquals(r.output + " (this JVM loaded " + loaded + ")", 0, r.exit);
        assertTrue(r.output, r.output.contains("outbox " + Outbox.version()));
    }

    @Test
    public void a_rust_panic_becomes_a_java_exception() {
        OutboxInternalException e = assertThrows(OutboxInternalException.class, Native::selfTestPanic);
        assertTrue(e.getMessage(), e.getMessage().contains("self-test panic"));
        // And the JVM, and the library, go on.
        assertNotEquals("", Outbox.version());
        assertThrows(OutboxInternalException.class, Native::selfTestPanic);
    }

    static final class Run {
        int exit;
        String output;
    }

    private static Run java(String... props) throws Exception {
        List<String> cmd = new ArrayList<>();
        cmd.add(Paths.get(System.getProperty("java.home"), "bin", "java").toString());
        cmd.addAll(Arrays.asList(props));
        cmd.add("-cp");
        cmd.add(System.getProperty("java.class.path"));
        cmd.add("io.outbox.Outbox");
        ProcessBuilder pb = new ProcessBuilder(cmd).redirectErrorStream(true);
        pb.environment().remove("OUTBOX_LIBRARY_PATH");
        Process proc = pb.start();
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        try (InputStream in = proc.getInputStream()) {
            in.transferTo(out);
        }
        assertTrue("child JVM finished", proc.waitFor(60, TimeUnit.SECONDS));
        Run r = new Run();
        r.exit = proc.exitValue();
        r.output = out.toString(StandardCharsets.UTF_8);
        return r;
    }
}
