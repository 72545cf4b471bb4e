// Listens for changes below a DN through JNDI's event API (which asks the
// server for a persistent search with entry change notifications) and
// prints one line per event: "added DN", "changed DN", "renamed OLD -> NEW",
// "removed DN". Usage: Listen <url> <bindDN> <password> <base>
import java.util.Hashtable;
import javax.naming.Binding;
import javax.naming.Context;
import javax.naming.directory.InitialDirContext;
import javax.naming.directory.SearchControls;
import javax.naming.event.EventDirContext;
import javax.naming.event.NamespaceChangeListener;
import javax.naming.event.NamingEvent;
import javax.naming.event.NamingExceptionEvent;
import javax.naming.event.ObjectChangeListener;

public class Listen {
    public static void main(String[] args) throws Exception {
        Hashtable<String, String> env = new Hashtable<>();
        env.put(Context.INITIAL_CONTEXT_FACTORY, "com.sun.jndi.ldap.LdapCtxFactory");
        env.put(Context.PROVIDER_URL, args[0]);
        env.put(Context.SECURITY_AUTHENTICATION, "simple");
        env.put(Context.SECURITY_PRINCIPAL, args[1]);
        env.put(Context.SECURITY_CREDENTIALS, args[2]);
        EventDirContext ctx = (EventDirContext) new InitialDirContext(env).lookup("");
        SearchControls sc = new SearchControls();
        sc.setSearchScope(SearchControls.SUBTREE_SCOPE);
        ctx.addNamingListener(args[3], "(objectClass=inetOrgPerson)", sc, new Printer());
        // Events arrive on JNDI's own thread until the test kills this process.
        Thread.sleep(600_000);
    }

    static String name(Binding b) {
        return b == null ? "?" : b.getName();
    }

    static class Printer implements NamespaceChangeListener, ObjectChangeListener {
        public void objectAdded(NamingEvent e) {
            say("added " + name(e.getNewBinding()));
        }

        public void objectRemoved(NamingEvent e) {
            say("removed " + name(e.getOldBinding()));
        }

        public void objectRenamed(NamingEvent e) {
            say("renamed " + name(e.getOldBinding()) + " -> " + name(e.getNewBinding()));
        }

        public void objectChanged(NamingEvent e) {
            say("changed " + name(e.getNewBinding()));
        }

        public void namingExceptionThrown(NamingExceptionEvent e) {
            say("error " + e.getException());
        }

        static synchronized void say(String line) {
            System.out.println(line);
            System.out.flush();
        }
    }
}
